"""The CLI as a user meets it: help, --json everywhere, one clear line for bad input."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

import hybrid
from hybrid.cli import COMMANDS, cli

DATA = Path(__file__).parent.parent / "data"


def hybrid_cmd(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybrid", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
    )


def leaf_commands(
    group: click.Group, ctx: click.Context, prefix: str = ""
) -> list[tuple[str, click.Command]]:
    leaves = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        path = f"{prefix} {name}".strip()
        if isinstance(command, click.Group):
            leaves += leaf_commands(command, ctx, path)
        if not isinstance(command, click.Group) or command.invoke_without_command:
            leaves.append((path, command))
    return leaves


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.output


def test_every_command_has_json() -> None:
    ctx = click.Context(cli)
    leaves = leaf_commands(cli, ctx)
    assert len(leaves) >= len(COMMANDS)
    missing = [
        path for path, command in leaves if not any("--json" in p.opts for p in command.params)
    ]
    assert missing == []


def test_public_api_matches_all() -> None:
    exported = {name for name in dir(hybrid) if not name.startswith("_")} - {
        "annotations",
        "errors",
        "policy",
        "results",
    }
    modules = {name for name in exported if type(getattr(hybrid, name)).__name__ == "module"}
    assert set(hybrid.__all__) == exported - modules
    for name in hybrid.__all__:
        assert getattr(hybrid, name) is not None


def test_every_error_carries_an_exit_code() -> None:
    for name in hybrid.__all__:
        obj = getattr(hybrid, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, hybrid.HybridError)
            assert obj.exit_code >= 1


def test_wasm_run_json(tmp_path: Path) -> None:
    result = hybrid_cmd("wasm", "run", str(DATA / "hello.wat"), "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["termination"] == "ok"
    assert payload["stdout"] == "hello\n"
    assert payload["tier"] == "wasm"
    assert payload["ok"] is True  # a reader of the JSON need not re-derive it
    wall = payload["usage"]["wall_ms"]
    assert round(wall, 2) == wall, "times are rounded to 0.01 ms in JSON"


def test_wasm_run_timeout_exit_code() -> None:
    result = hybrid_cmd(
        "wasm", "run", str(DATA / "spin.wat"), "--timeout", "0.2", "--fuel", "10000000000000"
    )
    assert result.returncode == 124
    assert "timeout" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["wasm", "run", "/nonexistent.wasm"], "no such file"),
        (["wasm", "run", str(Path(__file__))], "not a WebAssembly module"),
        (["wasm", "run", str(DATA / "hello.wat"), "--memory", "lots"], "not a size"),
        (["wasm", "run", str(DATA / "hello.wat"), "--dir", "/nonexistent:/x"], "not a directory"),
        (
            ["wasm", "run", str(DATA / "hello.wat"), "--dir", str(Path.home() / ".ssh") + ":/k"],
            "secret path",
        ),
        (["policy", "check", "/nonexistent.toml"], "no such policy file"),
        (
            ["wasm", "run", str(DATA / "hello.wat"), "--fuel", "0"],
            "--fuel: Input should be greater than 0",
        ),
        (["wasm", "run", str(DATA / "hello.wat"), "--disk", "lots"], "--disk: not a size"),
        (
            ["wasm", "run", str(DATA / "hello.wat"), "--disk", "8G"],
            "budget.disk: 8G is above the wasm tier's maximum of 1G",
        ),
        (["run", "--tier", "docker", "--disk", "0", "--", "true"], "--disk: Input should be"),
    ],
)
def test_bad_input_gives_one_line_and_nonzero_exit(
    args: list[str], message: str, tmp_path: Path
) -> None:
    (Path.home() / ".ssh").mkdir(exist_ok=True)
    result = hybrid_cmd(*args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_policy_check_cli(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    assert hybrid_cmd("policy", "init", str(good)).returncode == 0
    ok = hybrid_cmd("policy", "check", str(good), "--json")
    assert ok.returncode == 0
    assert json.loads(ok.stdout) == {"file": str(good), "admitted": True, "violations": []}
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[network]\nmode = "egress"\n[[mounts]]\nsource = "/tmp"\ntarget = "/out"\nmode = "rw"\n'
    )
    result = hybrid_cmd("policy", "check", str(bad))
    assert result.returncode == 3
    assert "egress without an allow-list" in result.stdout
    assert "writable mount outside the workspace" in result.stdout
    malformed = tmp_path / "malformed.toml"
    malformed.write_text("[budget]\nwall_seconds = 'soon'\n")
    result = hybrid_cmd("policy", "check", str(malformed))
    assert result.returncode == 2
    assert "budget.wall_seconds" in result.stderr


def test_version_short_flag() -> None:
    result = hybrid_cmd("-V")
    assert result.returncode == 0 and result.stdout.startswith("hybrid, version ")
    assert hybrid_cmd("--version").stdout == result.stdout


def test_shell_completion_as_documented(tmp_path: Path) -> None:
    """The completion the README and `hybrid --help` document works on the lazy command tree."""
    import os

    env = {**os.environ, "_HYBRID_COMPLETE": "bash_source"}
    done = subprocess.run(
        [sys.executable, "-m", "hybrid"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0 and "_hybrid_completion" in done.stdout, done.stderr
    env.update(_HYBRID_COMPLETE="bash_complete", COMP_WORDS="hybrid ch", COMP_CWORD="1")
    done = subprocess.run(
        [sys.executable, "-m", "hybrid"], capture_output=True, text=True, env=env, timeout=60
    )
    assert "plain,check" in done.stdout.splitlines(), done.stdout
    env.update(COMP_WORDS="hybrid ws ex", COMP_CWORD="2")
    done = subprocess.run(
        [sys.executable, "-m", "hybrid"], capture_output=True, text=True, env=env, timeout=60
    )
    assert "plain,exec" in done.stdout.splitlines(), done.stdout
    assert (
        "_HYBRID_COMPLETE=bash_source hybrid"
        in (Path(hybrid.__file__).parents[1] / "README.md").read_text()
    )


def test_verbose_logs_through_logging_and_the_library_attaches_no_handlers() -> None:
    result = hybrid_cmd("-v", "run", "--python", "print(6*7)")
    assert result.returncode == 0 and result.stdout == "42\n", result.stderr
    assert "hybrid: info: routed to python-wasm" in result.stderr
    quiet = hybrid_cmd("run", "--python", "print(6*7)")
    assert "info:" not in quiet.stderr
    probe = (
        "import logging, hybrid\n"
        "from hybrid import router\n"
        "router.run(router.Job(python='print(1)'), available={'python-wasm': (True, '')})\n"
        "hybrid.check_csv('a\\n1\\n')\n"
        "named = [n for n in logging.root.manager.loggerDict if n.startswith('hybrid')]\n"
        "assert named, 'the library logs through hybrid.* loggers'\n"
        "attached = [n for n in named if getattr(logging.getLogger(n), 'handlers', [])]\n"
        "assert attached == [] and logging.root.handlers == [], attached\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr


def test_every_environment_variable_is_documented() -> None:
    """Each HYBRID_* name the package, its scripts or its benchmarks read is in the README."""
    import re

    root = Path(hybrid.__file__).parents[1]
    readme = (root / "README.md").read_text()
    used: set[str] = set()
    for folder in ("hybrid", "scripts", "benchmarks"):
        for path in (root / folder).rglob("*"):
            if path.is_file() and path.suffix in ("", ".py", ".sh"):
                used |= set(
                    re.findall(r"\bHYBRID_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace"))
                )
    assert used >= {"HYBRID_CACHE_DIR", "HYBRID_STATE_DIR", "HYBRID_BASE_IMAGE"}
    missing = sorted(name for name in used if f"`{name}`" not in readme)
    assert missing == [], f"document these in the README's environment table: {missing}"


def test_only_a_process_about_to_exit_freezes_its_objects(hybrid_cli: Any, tmp_path: Path) -> None:
    """The console entry freezes the collector's objects as the process ends (its last passes
    would free nothing); a caller that passes arguments keeps its collector as it was."""
    frozen = gc.get_freeze_count()
    assert hybrid_cli("--version")[0] == 0
    assert gc.get_freeze_count() == frozen
    (tmp_path / "mod.py").write_text("def f(x):\n    return x\n")
    done = hybrid_cmd("map", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["entries"][0]["path"] == "mod.py"
