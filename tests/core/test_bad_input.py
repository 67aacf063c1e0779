"""Bad input to every CLI command: exactly one line on stderr, a non-zero exit, no traceback.

The command tree is walked like test_cli's --json check, so a new command must say here where
its file arguments go (FILE_SLOTS) and what it needs besides --policy (BASE_ARGS). Commands run
in process through the console entry point (fast); the unreadable-file cases run as
subprocesses under an unprivileged user (root reads anything). Commands that need the Docker
engine are given bad input that must fail before anything is created, and the test checks that
nothing by its names exists afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import pytest

from hybrid.cli import cli

DATA = Path(__file__).parent.parent / "data"
REPO = Path(__file__).resolve().parent.parent.parent
NAME = f"badinput-{secrets.token_hex(3)}"  # workstation name no one else uses


# Where each command takes a file or directory ("{}" is the slot) and which kind it expects.
FILE_SLOTS: dict[str, list[tuple[list[str], str]]] = {
    "check csv": [(["{}"], "file")],
    "check json": [(["{}"], "file"), (["{json}", "--schema", "{}"], "file")],
    "check grep": [(["x", "{}"], "any")],
    "check redact": [(["{}"], "file")],
    "check scope": [(["{}"], "file")],
    "context eval": [(["{}"], "dir")],
    "context pack": [(["{}", "--task", "x"], "dir")],
    "map": [(["{}"], "dir")],
    "skeleton": [(["{}"], "file")],
    "policy check": [(["{}"], "file")],
    "py run": [(["{}"], "file")],
    "py eval": [(["pass", "--file", "{}"], "file"), (["pass", "--test", "{}"], "file")],
    "wasm run": [
        (["{}"], "file"),
        (["{hello}", "--stdin", "{}"], "file"),
        (["{hello}", "--dir", "{}:/x"], "dir"),
    ],
    "run": [(["--repo", "{}", "--", "true"], "dir")],
    "route": [(["--repo", "{}", "--", "true"], "dir")],
    "ws up": [([NAME, "--repo", "{}"], "dir")],
    "deps show": [(["{}"], "dir")],
    "deps lock": [
        (["{}"], "dir"),
        (["{dir}", "--approved", "{}"], "file"),
        (["{dir}", "--output", "{}"], "out"),
    ],
    "deps admit": [
        (["{}"], "dir"),
        (["{dir}", "--approved", "{}"], "file"),
        (["{dir}", "--manifest", "{}"], "file"),
    ],
    "ws diff": [([NAME, "--output", "{}"], "out")],
    "validate": [(["{}", "HEAD"], "dir")],
    "policy init": [(["{}"], "out")],
    "ws cp": [],  # NAME:PATH pairs: see ENGINE_CASES (the copy itself is another test's)
    "solve": [
        (["--function", "--task", "x", "--tests", "{}", "--answer", "{snippet}"], "file"),
        (
            [
                "--function",
                "--task",
                "x",
                "--tests",
                "{snippet}",
                "--file",
                "{}",
                "--answer",
                "{snippet}",
            ],
            "file",
        ),
        (
            ["--function", "--task-file", "{}", "--tests", "{snippet}", "--answer", "{snippet}"],
            "file",
        ),
        (["--function", "--task", "x", "--tests", "{snippet}", "--answer", "{}"], "file"),
        (["--function", "--task", "x", "--tests", "{snippet}", "--replay", "{}"], "file"),
        (["--function", "--task", "x", "--tests", "{snippet}", "--model-config", "{}"], "file"),
        (["--task", "x", "--repo", "{}", "--test", "true", "--answer", "{snippet}"], "dir"),
        (
            [
                "--function",
                "--task",
                "x",
                "--tests",
                "{snippet}",
                "--answer",
                "{snippet}",
                "--bundle",
                "{}",
            ],
            "out",
        ),
        (
            [
                "--function",
                "--task",
                "x",
                "--tests",
                "{snippet}",
                "--answer",
                "{snippet}",
                "--record",
                "{}",
            ],
            "out",
        ),
    ],
    "gate": [
        (["{}", "--repo", "{dir}", "--test", "true"], "file"),
        (["{diff}", "--repo", "{}", "--test", "true"], "dir"),
    ],
    "mcp": [
        (["--root", "{}"], "dir"),
        (["--root", "{dir}", "--replay", "{}"], "file"),
        (["--root", "{dir}", "--model-config", "{}"], "file"),
        (["--root", "{dir}", "--answer", "{}"], "file"),
    ],
    "eval": [
        (["{}", "--builtin", "oracle"], "file"),
        (["{json}", "--replay", "{}"], "file"),
        (["{json}", "--model-config", "{}"], "file"),
        (["{json}", "--answer", "{}"], "file"),
    ],
}
# Commands whose file content is parsed: bad content there is bad input, not data to report on.
PARSED = {
    ("check json", 1): ["garbage", "bad_json"],
    ("check scope", 0): ["garbage", "bad_diff"],
    ("policy check", 0): ["garbage", "bad_toml", "bool_toml"],
    ("py run", 0): ["garbage"],
    ("py eval", 1): ["garbage"],
    ("wasm run", 0): ["garbage"],
    ("skeleton", 0): ["garbage"],
    ("solve", 4): ["garbage"],
    ("solve", 5): ["garbage", "bad_toml"],
    ("gate", 0): ["garbage", "bad_diff"],
    ("eval", 0): ["garbage", "bad_json"],
    ("deps lock", 1): ["garbage", "bad_json"],
    ("deps admit", 1): ["garbage", "bad_json"],
    ("deps admit", 2): ["garbage", "bad_json"],
}
# Arguments that make a command with --policy parse, so the policy file is what fails.
BASE_ARGS: dict[str, list[str]] = {
    "check csv": ["{csv}"],
    "check json": ["{json}"],
    "check grep": ["x", "{dir}"],
    "check redact": ["{csv}"],
    "check scope": ["{diff}"],
    "py run": ["{snippet}"],
    "py eval": ["pass"],
    "wasm run": ["{hello}"],
    "run": ["--", "true"],
    "route": ["--", "true"],
    "ws up": [NAME],
    "mcp": ["--root", "{dir}"],
    "deps lock": ["{dir}"],
    "deps admit": ["{dir}"],
    "validate": ["{dir}", "HEAD"],
}
BAD_POLICIES = ["missing", "latin1_missing", "dir", "garbage", "bad_toml", "bool_toml", "tiny_toml"]
# Budget options and values no budget can take.
BAD_BUDGETS = {
    "--memory": ["lots", "9" * 400, "-1"],
    "--timeout": ["nan", "-1", "inf"],
    "--fuel": ["0", "1" + "0" * 40],
    "--pids": ["0"],
    "--cpus": ["-1"],
    "--output-bytes": ["x"],
}
# Commands that need the engine, with bad input that must fail before anything is made.
ENGINE_CASES = [
    ["ws", "up", "Bad Name!"],
    ["ws", "up", "x" * 100_000],
    ["ws", "up", NAME, "--from", "no-such-snapshot", "--image", "x"],
    ["ws", "up", NAME, "--allow", "*"],
    ["ws", "up", NAME, "--gvisor", "--allow", "example.com"],
    ["ws", "up", NAME, "--memory", "1"],
    ["ws", "up", NAME, "--deps"],
    ["ws", "deps", NAME],
    ["ws", "exec", NAME, "--", "true"],
    ["ws", "exec", "Bad Name!", "--", "true"],
    ["ws", "diff", NAME],
    ["ws", "shell", "Bad Name!"],  # never a real name: a found one would exec a shell over the test
    ["ws", "snapshot", NAME, "snap"],
    ["ws", "fork", NAME, "0"],
    ["ws", "fork", NAME, "2"],
    ["ws", "down", "Bad Name!"],
    ["ws", "cp", f"{NAME}:/x", "/tmp/nowhere"],
    ["ws", "cp", "/no/such/file", f"{NAME}:/x"],
    ["image", "show", "--tag", "no/such:image"],
    ["image", "show", "--tag", "x" * 100_000],
    ["image", "bootstrap", "--tag", "no-colon"],
    ["run", "--tier", "docker", "--allow", "*:*", "--", "true"],
    ["run", "--tier", "gvisor", "--memory", "1", "--", "true"],
]
# Oversized and malformed arguments that are not files.
ARG_CASES = [
    ["check", "grep", "(" * 100_000, "{dir}"],
    ["check", "grep", "x" * 2_000_000, "{dir}"],
    ["check", "csv", "{csv}", "--types", "a"],
    ["check", "csv", "{csv}", "--delimiter", "too-long"],
    ["wasm", "run", "{hello}", "--env", "NOEQUALS"],
    ["wasm", "run", "{hello}", "--dir", "a:b:c:d"],
    ["wasm", "run", "{hello}", "--dir", "{dir}:relative"],
    ["py", "eval", "pass", "--file", "{latin1_csv}"],
    ["context", "pack", "{dir}"],
    ["map", "{dir}", "--tokens", "0"],
    ["run", "--tier", "mainframe", "--", "true"],
    ["run"],
    ["mcp", "--root", "{dir}", "--idle", "0"],
    ["mcp", "--root", "{dir}", "--transport", "http", "--host", "0.0.0.0"],
    ["mcp", "--root", "/"],
    ["validate", "{dir}", "HEAD"],  # not a git repository
    ["validate", "{dir}", "x" * 100_000],
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad-input")
    (root / "dir").mkdir()
    (root / "dir" / "a.txt").write_text("hello\n")
    paths = {
        "missing": root / "no-such-file",
        "latin1_missing": root / os.fsdecode(b"absent-\xe9"),
        "dir": root / "dir",
        "garbage": root / "garbage.bin",
        "bad_toml": root / "bad.toml",
        "bool_toml": root / "bool.toml",
        "tiny_toml": root / "tiny.toml",
        "bad_json": root / "bad.json",
        "bad_diff": root / "bad.diff",
        "csv": root / "ok.csv",
        "json": root / "ok.json",
        "diff": root / "ok.diff",
        "snippet": root / "ok.py",
        "latin1_csv": root / os.fsdecode(b"caf\xe9.csv"),
        "unreadable": root / "unreadable.txt",
        "unwritable": Path("/proc/no/such.out"),
    }
    paths["garbage"].write_bytes(bytes(range(256)) * 64 + os.urandom(4096))
    paths["bad_toml"].write_text("[budget\nmemory = ")
    paths["bool_toml"].write_text("[budget]\nfuel = true\n")
    paths["tiny_toml"].write_text('tier = "docker"\n[budget]\nmemory = "1"\n')
    paths["bad_json"].write_text('{"type": ')
    paths["bad_diff"].write_text("--- a/x\n+++ b/x\n@@ garbage @@\n")
    paths["csv"].write_text("a,b\n1,2\n")
    paths["json"].write_text("{}\n")
    paths["diff"].write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    paths["snippet"].write_text("print(1)\n")
    paths["latin1_csv"].write_text("a,b\n1,2\n")
    paths["unreadable"].write_text("secret-ish\n")
    paths["unreadable"].chmod(0)
    values = {k: str(v) for k, v in paths.items()}
    values["hello"] = str(DATA / "hello.wat")
    return values


def fill(args: list[str], inputs: dict[str, str], slot: str = "") -> list[str]:
    return [a.replace("{}", slot).format_map(_Keep(inputs)) for a in args]


class _Keep(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def assert_one_line(code: int, err: str, args: list[str]) -> None:
    shown = " ".join(a[:60] for a in args)
    assert code != 0, f"{shown}: exit 0"
    assert "Traceback" not in err, f"{shown}:\n{err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"{shown}: {len(lines)} lines on stderr:\n{err[:2000]}"


def _file_cases() -> Iterator[tuple[str, list[str], str]]:
    for command, slots in FILE_SLOTS.items():
        for index, (args, kind) in enumerate(slots):
            bad = ["missing", "latin1_missing"]
            bad += {"file": ["dir"], "dir": ["csv"], "out": ["unwritable"], "any": []}[kind]
            if kind == "out":
                bad = ["unwritable"]
            bad += PARSED.get((command, index), [])
            for name in bad:
                yield command, args, name


FILE_CASES = list(_file_cases())


@pytest.mark.parametrize(
    ("command", "args", "bad"),
    FILE_CASES,
    ids=[f"{c}-{i}-{b}" for i, (c, _, b) in enumerate(FILE_CASES)],
)
def test_bad_files(hybrid_cli, inputs, command: str, args: list[str], bad: str) -> None:
    argv = [*command.split(), *fill(args, inputs, inputs[bad])]
    code, _, err = hybrid_cli(*argv)
    assert_one_line(code, err, argv)


POLICY_CASES = [(c, bad) for c in BASE_ARGS for bad in BAD_POLICIES]


@pytest.mark.parametrize(
    ("command", "bad"), POLICY_CASES, ids=[f"{c}-{b}" for c, b in POLICY_CASES]
)
def test_bad_policy_files(hybrid_cli, inputs, command: str, bad: str) -> None:
    argv = [*command.split(), "--policy", inputs[bad], *fill(BASE_ARGS[command], inputs)]
    if command in ("run", "route"):  # --policy must come before the command after --
        argv = [*command.split(), "--policy", inputs[bad], "--", "true"]
    code, _, err = hybrid_cli(*argv)
    assert_one_line(code, err, argv)


def _budget_cases() -> Iterator[tuple[str, str, str]]:
    for path, command in leaves_now():
        names = {opt for p in command.params for opt in p.opts}
        for option, values in BAD_BUDGETS.items():
            if option in names and path in BASE_ARGS:
                for value in values:
                    yield path, option, value


def leaves_now() -> list[tuple[str, click.Command]]:
    """Every leaf command, walked by test_cli's own walker (loaded by path: tests are no package)."""
    spec = importlib.util.spec_from_file_location("_walk", Path(__file__).with_name("test_cli.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    leaves: list[tuple[str, click.Command]] = module.leaf_commands(cli, click.Context(cli))
    return leaves


BUDGET_CASES = list(_budget_cases())


@pytest.mark.parametrize(
    ("command", "option", "value"),
    BUDGET_CASES,
    ids=[f"{c}-{o}-{v[:8]}" for c, o, v in BUDGET_CASES],
)
def test_bad_budget_values(hybrid_cli, inputs, command: str, option: str, value: str) -> None:
    base = fill(BASE_ARGS[command], inputs)
    if command in ("run", "route"):
        argv = [*command.split(), option, value, "--tier", "docker", *base]
    else:
        argv = [*command.split(), option, value, *base]
    code, _, err = hybrid_cli(*argv)
    assert_one_line(code, err, argv)


LEAVES = [path for path, _ in leaves_now()]


@pytest.mark.parametrize("command", LEAVES)
def test_unknown_options_and_garbage_arguments(hybrid_cli, command: str) -> None:
    if dict(leaves_now())[command].context_settings.get("ignore_unknown_options"):
        pytest.skip("passes unknown options on to the command it runs")
    for extra in (["--no-such-option"], ["--no-such-option=" + "\udcff" * 10_000]):
        argv = [*command.split(), *extra]
        code, _, err = hybrid_cli(*argv)
        assert_one_line(code, err, argv)


@pytest.mark.parametrize("args", ARG_CASES, ids=[" ".join(a)[:40] for a in ARG_CASES])
def test_malformed_and_oversized_arguments(hybrid_cli, inputs, args: list[str]) -> None:
    argv = fill(args, inputs)
    only_in_process(argv)
    code, _, err = hybrid_cli(*argv)
    assert_one_line(code, err, argv)


MAX_ARG_STRLEN = 131072


def only_in_process(argv: list[str]) -> None:
    """An argument past the kernel's per-argument limit only exists in process: no `hybrid`
    process, server or not, can be started with it (the suite's run through the server skips it)."""
    if os.environ.get("HYBRID_TEST_VIA_SERVER") and any(
        len(a.encode("utf-8", "surrogateescape")) >= MAX_ARG_STRLEN for a in argv
    ):
        pytest.skip("an argument past MAX_ARG_STRLEN cannot reach a process")


def with_json(argv: list[str]) -> list[str]:
    """``argv`` with --json right after its command path (before any ``--``)."""
    words = next(n for n in range(len(argv), 0, -1) if " ".join(argv[:n]) in LEAVES)
    return [*argv[:words], "--json", *argv[words:]]


JSON_CASES = [[*c.split(), *args] for c, args, bad in FILE_CASES if bad == "missing"] + ARG_CASES


@pytest.mark.parametrize("args", JSON_CASES, ids=[" ".join(a)[:40] for a in JSON_CASES])
def test_json_errors_are_json_on_stdout_too(hybrid_cli, inputs, args: list[str]) -> None:
    """Under --json a refusal is {"error": {type, message, exit_code}} on stdout, besides the
    one stderr line, so a tool reading stdout never has to parse prose."""
    argv = with_json(fill(args, inputs, inputs["missing"]))
    only_in_process(argv)
    code, out, err = hybrid_cli(*argv)
    assert_one_line(code, err, argv)
    error = json.loads(out)["error"]
    assert set(error) == {"type", "message", "exit_code"}
    assert error["exit_code"] == code
    assert error["message"] and error["message"] in err
    plain = [a for a in argv if a != "--json"]
    code, out, err = hybrid_cli(*plain)
    assert out == "", "without --json, an error prints nothing on stdout"


def _engine_objects() -> list[str]:
    try:
        from hybrid.workstation.docker import client

        api = client().api
    except Exception:  # no engine here: the commands said so in one line, nothing to check
        return []
    found = [c["Names"][0] for c in api.containers(all=True, filters={"name": NAME})]
    volumes = api.volumes(filters={"name": NAME}).get("Volumes") or []
    found += [v["Name"] for v in volumes]
    found += [n["Name"] for n in api.networks(names=[f"hybrid-{NAME}-net"])]
    return found


@pytest.mark.parametrize("args", ENGINE_CASES, ids=[" ".join(a)[:40] for a in ENGINE_CASES])
def test_engine_commands_refuse_bad_input_without_making_anything(
    hybrid_cli, inputs, args: list[str]
) -> None:
    argv = fill(args, inputs)
    code, _, err = hybrid_cli(*argv)
    assert_one_line(code, err, argv)
    assert _engine_objects() == []


def test_every_command_with_files_or_a_policy_is_covered() -> None:
    """A new command (or a new file option) must be added to the tables above."""
    for path, command in leaves_now():
        params = {p.name for p in command.params}
        takes_paths = any(
            isinstance(p.type, click.Path) and p.name != "policy_file" for p in command.params
        ) or params & {"file", "diff", "directory", "module"}
        if takes_paths:
            assert path in FILE_SLOTS, f"{path}: say where its files go in FILE_SLOTS"
        if "policy_file" in params:
            assert path in BASE_ARGS, f"{path}: give its other arguments in BASE_ARGS"


UNREADABLE = [
    ["policy", "check", "{unreadable}"],
    ["check", "csv", "{unreadable}"],
    ["check", "json", "{json}", "--schema", "{unreadable}"],
    ["check", "scope", "{unreadable}"],
    ["check", "grep", "x", "{unreadable}"],
    ["py", "run", "{unreadable}"],
    ["py", "eval", "pass", "--file", "{unreadable}"],
    ["wasm", "run", "{unreadable}"],
    ["wasm", "run", "{hello}", "--stdin", "{unreadable}"],
    ["skeleton", "{unreadable}"],
    ["run", "--policy", "{unreadable}", "--", "true"],
]


def test_unreadable_files_without_privileges(inputs) -> None:
    """chmod 000 stops everyone but a privileged root: these run with every capability dropped."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() == 0 and setpriv is None:
        pytest.fail("setpriv (util-linux) is needed to drop root's capabilities")
    prefix = [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"] if os.geteuid() == 0 else []
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def one(args: list[str]) -> tuple[list[str], int, str]:
        argv = fill(args, inputs)
        proc = subprocess.run(
            [*prefix, sys.executable, "-m", "hybrid", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        return argv, proc.returncode, proc.stderr

    with ThreadPoolExecutor(4) as pool:
        for argv, code, err in pool.map(one, UNREADABLE):
            assert_one_line(code, err, argv)
            assert "Permission denied" in err or "is not readable" in err, (argv, err)
