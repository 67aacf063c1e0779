"""``hybrid wasm run``: run any WASI command module under fuel, memory and time caps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from hybrid.cli._output import emit, json_option
from hybrid.errors import InvalidInput
from hybrid.policy import Budget, Mount, SandboxSpec, parse_size
from hybrid.results import ExecutionResult


@click.group()
def wasm() -> None:
    """Run WASI modules in the embedded WebAssembly tier."""


def budget_options(func: Any) -> Any:
    """--fuel/--memory/--timeout/--policy, shared by every command that runs a guest."""
    func = click.option(
        "--policy",
        "policy_file",
        type=click.Path(path_type=Path),
        help="SandboxSpec TOML to start from.",
    )(func)
    func = click.option("--timeout", type=float, help="Wall-clock deadline in seconds.")(func)
    func = click.option("--memory", help="Memory cap, e.g. 128M.")(func)
    func = click.option("--fuel", type=int, help="Fuel budget (roughly instructions).")(func)
    return func


def spec_from_options(
    policy_file: Path | None,
    fuel: int | None,
    memory: str | None,
    timeout: float | None,
    tier: str = "wasm",
    **extra: object,
) -> SandboxSpec:
    """A SandboxSpec from a policy file (or the defaults) with command-line overrides applied."""
    spec = SandboxSpec.from_toml(policy_file) if policy_file else SandboxSpec(tier=tier)
    budget = spec.budget.model_dump()
    try:
        if fuel is not None:
            budget["fuel"] = fuel
        if memory is not None:
            budget["memory"] = parse_size(memory)
        if timeout is not None:
            budget["wall_seconds"] = timeout
        new_budget = Budget.model_validate(budget)
    except ValidationError as exc:
        error = exc.errors()[0]
        option = _OPTION_FOR.get(str(error["loc"][0]), str(error["loc"][0]))
        raise InvalidInput(f"{option}: {error['msg']}") from None
    except ValueError as exc:
        raise InvalidInput(f"--memory: {exc}") from None
    return spec.model_copy(update={"budget": new_budget, **extra})


_OPTION_FOR = {"fuel": "--fuel", "memory": "--memory", "wall_seconds": "--timeout"}


def parse_dir(value: str) -> Mount:
    """HOST:GUEST[:ro|rw] -> Mount (GUEST defaults to /HOST's name, mode to ro)."""
    parts = value.split(":")
    if len(parts) > 3 or not parts[0]:
        raise InvalidInput(f"--dir {value!r}: use HOST:GUEST[:ro|rw]")
    host = Path(parts[0])
    guest = parts[1] if len(parts) > 1 and parts[1] else "/" + host.resolve().name
    mode = parts[2] if len(parts) > 2 else "ro"
    if mode not in ("ro", "rw"):
        raise InvalidInput(f"--dir {value!r}: mode must be ro or rw")
    if not host.is_dir():
        raise InvalidInput(f"--dir {value!r}: {host} is not a directory")
    try:
        return Mount(source=host.resolve(), target=guest, mode=mode)
    except ValidationError as exc:
        raise InvalidInput(f"--dir {value!r}: {exc.errors()[0]['msg']}") from None


def render_result(result: ExecutionResult) -> None:
    """Guest output to our stdout/stderr, then one status line on stderr when it did not end ok."""
    if result.stdout:
        click.echo(result.stdout, nl=not result.stdout.endswith("\n"))
    if result.stderr:
        click.echo(result.stderr, nl=not result.stderr.endswith("\n"), err=True)
    if result.stdout_truncated or result.stderr_truncated:
        click.echo("hybrid: output was truncated at the output_bytes budget", err=True)
    if result.termination.value != "ok":
        click.echo(f"hybrid: {result.termination.value}: {result.detail}", err=True)


def exit_code_for(result: ExecutionResult) -> int:
    """The guest's own exit status when it exited, else 124 for a timeout and 125 for other stops."""
    if result.exit_code is not None and result.termination.value in ("ok", "nonzero_exit"):
        return result.exit_code
    return 124 if result.termination.value == "timeout" else 125


@wasm.command("run", context_settings={"ignore_unknown_options": True})
@click.argument("module", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@budget_options
@click.option(
    "--dir",
    "dirs",
    multiple=True,
    metavar="HOST:GUEST[:ro|rw]",
    help="Grant a host directory (read-only unless :rw, which must be under the workspace).",
)
@click.option(
    "--stdin", "stdin_file", type=click.Path(path_type=Path), help="File to feed on stdin."
)
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="NAME=VALUE",
    help="Set a variable in the guest (nothing is inherited).",
)
@json_option
def run_cmd(
    module: Path,
    args: tuple[str, ...],
    policy_file: Path | None,
    fuel: int | None,
    memory: str | None,
    timeout: float | None,
    dirs: tuple[str, ...],
    stdin_file: Path | None,
    env_pairs: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run MODULE (.wasm or .wat) as a WASI command: hybrid wasm run MOD.wasm [OPTIONS] -- ARGS."""
    from hybrid.wasm import run

    spec = spec_from_options(policy_file, fuel, memory, timeout)
    mounts = [*spec.mounts, *(parse_dir(d) for d in dirs)]
    env = spec.env.model_copy(deep=True)
    for pair in env_pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidInput(f"--env {pair!r}: use NAME=VALUE")
        env.set[name] = value
        env.allow.append(name)
    spec = spec.model_copy(update={"mounts": mounts, "env": env})
    if stdin_file is not None and not stdin_file.is_file():
        raise InvalidInput(f"--stdin {stdin_file}: no such file")
    result = run(module, list(args), stdin=stdin_file, spec=spec, program=module.name)
    emit(result, as_json, lambda: render_result(result))
    code = exit_code_for(result)
    if code:
        raise click.exceptions.Exit(code)
