"""The ``hybrid`` command line: a thin layer over the library.

Command groups load lazily, so ``hybrid --help`` and a WebAssembly check never import the
Docker SDK or tree-sitter.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

import click

from hybrid.errors import HybridError

# name -> (module, attribute, one-line help). Add a line here to add a command.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "policy": (
        "hybrid.cli.policy",
        "policy",
        "Check and write sandbox policies (SandboxSpec TOML).",
    ),
    "wasm": ("hybrid.cli.wasm", "wasm", "Run WASI modules in the embedded WebAssembly tier."),
    "ws": (
        "hybrid.cli.ws",
        "ws",
        "Workstations: hardened Docker/gVisor sandboxes holding a repository copy.",
    ),
    "engine": (
        "hybrid.cli.engine",
        "engine",
        "Install and start the Docker engine with gVisor, and the base image (root).",
    ),
    "image": (
        "hybrid.cli.image",
        "image",
        "Build the base workstation image with debootstrap (no registry).",
    ),
    "deps": (
        "hybrid.cli.deps",
        "deps",
        "A project's dependencies: locked on the host, admitted, installed offline.",
    ),
    "cache": (
        "hybrid.cli.deps",
        "cache",
        "Dependency caches (artifact store, installed layers): sizes and pruning.",
    ),
    "run": ("hybrid.cli.tiers", "run_cmd", "Run a command on the cheapest tier that honours it."),
    "route": ("hybrid.cli.tiers", "route_cmd", "Explain which tier would run a job, and why."),
    "doctor": (
        "hybrid.cli.tiers",
        "doctor_cmd",
        "Which tiers this host can run, and how to enable the rest.",
    ),
    "check": (
        "hybrid.cli.check",
        "check",
        "Built-in checks (csv, json, grep, redact, scope) in WebAssembly.",
    ),
    "py": ("hybrid.cli.py", "py", "Run Python snippets and their tests in CPython-in-WebAssembly."),
    "map": (
        "hybrid.cli.context",
        "map_cmd",
        "Ranked repo map: files and key signatures under a token budget.",
    ),
    "skeleton": (
        "hybrid.cli.context",
        "skeleton_cmd",
        "Files with bodies elided (imports, signatures, docstrings).",
    ),
    "context": (
        "hybrid.cli.context",
        "context",
        "Task context packs; `context eval` scores ranking on git history.",
    ),
    "solve": (
        "hybrid.cli.agent",
        "solve_cmd",
        "The generate-execute-debug loop on a repository or (--function) a function task.",
    ),
    "gate": (
        "hybrid.cli.agent",
        "gate_cmd",
        "Review gate for a patch: tests, regressions, scope, secrets, dependencies.",
    ),
    "validate": (
        "hybrid.cli.validate",
        "validate_cmd",
        "Validate a real fix commit: its tests fail at the parent and pass with the fix.",
    ),
    "eval": (
        "hybrid.cli.agent",
        "eval_cmd",
        "HumanEval-format problems through the loop; unbiased pass@k.",
    ),
    "serve": (
        "hybrid.cli.serve",
        "serve",
        "The resident server that keeps run/check/py/map/context warm.",
    ),
    "mcp": ("hybrid.cli.mcp", "mcp_cmd", "Serve the tools to agents over MCP (stdio or HTTP)."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported only when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module, attr, _ = entry
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(None, "-V", "--version", package_name="hybrid")
@click.option(
    "--no-server",
    is_flag=True,
    expose_value=False,
    help="Run in this process, not through the resident server (also HYBRID_NO_SERVER=1).",
)
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="Log what the library does on stderr (-vv: more detail).",
)
def cli(verbose: int) -> None:
    """hybrid: real-file context, tiered sandboxes and a generate-execute-debug loop for coding agents.

    Shell completion: eval "$(_HYBRID_COMPLETE=bash_source hybrid)" in ~/.bashrc
    (zsh_source in ~/.zshrc; fish: _HYBRID_COMPLETE=fish_source hybrid | source).
    """
    if verbose:
        from hybrid.cli._output import log_to_stderr

        log_to_stderr(logging.INFO if verbose == 1 else logging.DEBUG)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C raises KeyboardInterrupt so the same cleanup runs
    (a sandbox stopped and removed, scratch directories deleted)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _terminate(signum: int, frame: FrameType | None) -> None:
    # A second signal must not cut short the cleanup the first one started.
    for repeat in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(repeat, signal.SIG_IGN)
    raise Terminated(signum)


def _handle_termination() -> dict[int, Any]:
    # The command line's own choice: the library installs no handlers. An ignored SIGHUP
    # (nohup) stays ignored. Returns what to restore.
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {
        s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    }
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if previous[signum] is signal.SIG_DFL:
            signal.signal(signum, _terminate)
    return previous


def _interrupted(exc: BaseException) -> None:
    cause = exc if isinstance(exc, Terminated) else exc.__cause__
    if isinstance(cause, Terminated):
        click.echo(f"hybrid: terminated by {cause}", err=True)
        sys.exit(128 + cause.signum)
    click.echo(
        "hybrid: interrupted" if isinstance(exc, KeyboardInterrupt) else "hybrid: aborted", err=True
    )
    sys.exit(130)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: every HybridError becomes one line on stderr and its exit code."""
    # The CLI uses no pydantic plugins; skipping their entry-point scan saves ~13 ms per command.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    previous = _handle_termination()
    try:
        _main(argv)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if argv is None:
            # The process ends next: the collector's last passes would walk every object the
            # command made (a cold map of sympy: ~0.07 s) to free what exiting frees anyway.
            gc.freeze()


def _main(argv: list[str] | None) -> None:
    from hybrid.cli._output import emit_error, json_asked, log_to_stderr, usage_error_line

    log_to_stderr()
    json_asked(reset=True)
    try:
        # Without standalone mode click returns the code of a click.exceptions.Exit instead of exiting.
        code = cli.main(args=argv, prog_name="hybrid", standalone_mode=False)
    except HybridError as exc:
        click.echo(f"hybrid: error: {exc.message}", err=True)
        emit_error(type(exc).__name__, exc.message, exc.exit_code)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:
        _interrupted(exc)
    except click.UsageError as exc:
        line = usage_error_line(exc)
        click.echo(line, err=True)
        emit_error("UsageError", line.removeprefix("hybrid: error: "), exc.exit_code)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        emit_error(type(exc).__name__, exc.format_message(), exc.exit_code)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        _interrupted(exc)
    except BrokenPipeError:
        sys.exit(141)
    sys.exit(code if isinstance(code, int) else 0)
