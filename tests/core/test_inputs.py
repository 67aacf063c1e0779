"""Inputs a user names pass the secret-path rule mounts pass (issue 9, failure 8), and the bad
input the hostile run found gives one line (policy init, non-UTF-8 names, grep, wasm traps)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from hybrid import PolicyViolation, checks
from hybrid.paths import read_input
from hybrid.policy import allow_secret_paths, check_input_path
from hybrid.results import Termination
from hybrid.wasm import run

DATA = Path(__file__).parent.parent / "data"
HELLO = str(DATA / "hello.wat")


@pytest.fixture
def links(tmp_path: Path) -> dict[str, Path]:
    """Innocent-looking names for host secrets: a file link, a link to a file inside a linked
    directory, and a directory link."""
    (tmp_path / "notes.txt").symlink_to("/etc/shadow")
    (tmp_path / "etc").symlink_to("/etc")
    (tmp_path / "keys").symlink_to("/etc/ssh")
    return {
        "file": tmp_path / "notes.txt",
        "nested": tmp_path / "etc" / "shadow",
        "dir": tmp_path / "keys",
    }


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("which", ["file", "nested"])
def test_read_input_refuses_secret_paths_through_symlinks(links, which: str) -> None:
    with pytest.raises(PolicyViolation, match="reads the host secret path /etc/shadow"):
        read_input(links[which], "input file")
    with pytest.raises(PolicyViolation):
        read_input(Path("/etc/shadow"))
    with pytest.raises(PolicyViolation, match="/etc/ssh"):
        check_input_path(links["dir"] / "sshd_config")


def test_the_override_is_explicit_and_logged(links, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="hybrid"), allow_secret_paths():
        assert read_input(links["file"]).startswith(b"root:")
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "/etc/shadow" in record.getMessage() and "--allow-secret-path" in record.getMessage()
    with pytest.raises(PolicyViolation):  # only inside the block
        read_input(links["file"])


def test_library_inputs_pass_the_rule(links) -> None:
    with pytest.raises(PolicyViolation):
        checks.grep("root", "/etc/shadow")
    with pytest.raises(PolicyViolation):
        checks.grep("root", links["file"])
    with pytest.raises(PolicyViolation):
        checks.check_csv(links["nested"])
    with pytest.raises(PolicyViolation):
        run(Path(HELLO), stdin=links["file"])
    with pytest.raises(PolicyViolation):
        checks.grep("PermitRootLogin", links["dir"])  # a directory: the mount rule


@pytest.mark.parametrize(
    "args",
    [
        ["py", "eval", "print(open('shadow').read())", "--file", "/etc/shadow"],
        ["py", "eval", "print(open('notes.txt').read())", "--file", "{file}"],
        ["py", "eval", "pass", "--test", "{nested}"],
        ["py", "run", "{file}"],
        ["check", "grep", "root", "/etc/shadow"],
        ["check", "grep", "root", "{nested}"],
        ["check", "grep", "Port", "{dir}"],
        ["check", "csv", "{file}"],
        ["check", "json", "{file}"],
        ["check", "json", str(DATA / "hello.wat"), "--schema", "{nested}"],
        ["check", "redact", "{file}"],
        ["check", "scope", "{nested}"],
        ["wasm", "run", HELLO, "--stdin", "{file}"],
        ["wasm", "run", HELLO, "--dir", "{dir}:/keys"],
        ["wasm", "run", "{nested}"],
    ],
)
def test_cli_inputs_naming_secret_paths_are_refused(hybrid_cli, links, args: list[str]) -> None:
    argv = [a.format(**{k: str(v) for k, v in links.items()}) for a in args]
    code, out, err = hybrid_cli(*argv)
    assert code == 3, (code, out, err)
    assert "host secret path /etc/" in one_line(err)
    assert "root:" not in out + err


def test_allow_secret_path_reads_and_warns(hybrid_cli, links) -> None:
    code, out, err = hybrid_cli("check", "grep", "^root:", str(links["file"]), "--json")
    assert code == 3
    code, out, err = hybrid_cli(
        "check", "grep", "^root:", str(links["file"]), "--json", "--allow-secret-path"
    )
    assert code == 0 and '"found": true' in out
    assert one_line(err).startswith("hybrid: warning: file to search")
    code, out, err = hybrid_cli(
        "wasm", "run", HELLO, "--stdin", "/etc/shadow", "--allow-secret-path"
    )
    assert code == 0 and out == "hello\n"
    assert "hybrid: warning: stdin file /etc/shadow" in one_line(err)


def test_policy_init_into_an_unwritable_place(hybrid_cli, tmp_path: Path) -> None:
    code, _, err = hybrid_cli("policy", "init", "/proc/nope.toml")
    assert (
        code == 2
        and one_line(err)
        == "hybrid: error: /proc/nope.toml: cannot write: No such file or directory"
    )
    code, _, err = hybrid_cli("policy", "init", str(tmp_path / "no" / "dir" / "p.toml"))
    assert code == 2 and "cannot write" in one_line(err)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def latin1(tmp_path: Path) -> Path:
    """A directory and files whose names are not UTF-8 (a Latin-1 'é')."""
    root = tmp_path / os.fsdecode(b"caf\xe9")
    root.mkdir()
    (root / os.fsdecode(b"d\xe9j\xe0.csv")).write_text("a,b\n1,2\n")
    (root / "readme.txt").write_text("root is here\n")
    return root


def test_non_utf8_names_to_check_csv_and_grep(hybrid_cli, latin1: Path) -> None:
    csv = latin1 / os.fsdecode(b"d\xe9j\xe0.csv")
    code, out, err = hybrid_cli("check", "csv", str(csv), "--require", "a,b")
    assert code == 0 and "rows:    1" in out and "Traceback" not in err
    code, out, err = hybrid_cli("check", "grep", "a,b", str(csv))
    assert code == 0 and ":1:1:a,b" in out, err
    # The directory holds a name WASI cannot list: grep says so instead of "0 of 0 files".
    code, out, err = hybrid_cli("check", "grep", "root", str(latin1))
    assert code == 1
    assert "skipped unreadable: .: cannot list" in one_line(err)
    assert "not UTF-8" in err
    report = checks.grep("root", latin1)
    assert report.unreadable and not report.found


def test_non_utf8_file_name_to_py_eval(hybrid_cli, latin1: Path) -> None:
    code, _, err = hybrid_cli(
        "py", "eval", "pass", "--file", str(latin1 / os.fsdecode(b"d\xe9j\xe0.csv"))
    )
    assert code == 2 and "the name is not UTF-8" in one_line(err)


def test_map_of_a_missing_directory_is_one_line(hybrid_cli) -> None:
    code, _, err = hybrid_cli("map", "/nonexistent")
    assert code == 2
    assert one_line(err) == (
        "hybrid: error: Invalid value for '[PATH]': Directory '/nonexistent' does not exist. "
        "(see 'hybrid map --help')"
    )


TRAP = """(module
  (func $inner unreachable)
  (func $middle call $inner)
  (func (export "_start") call $middle)
  (memory (export "memory") 1))"""


def test_wasm_trap_detail_keeps_the_cause_and_frames() -> None:
    result = run(TRAP.encode())
    assert result.termination is Termination.TRAP
    assert result.detail.startswith("wasm `unreachable` instruction executed (in inner <- middle")
    assert "\n" not in result.detail
