"""grep check: file:line:col, context, globs, binary files, bad patterns, and catastrophic regexes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hybrid.checks import grep
from hybrid.errors import InvalidInput, InvalidPattern, OutOfFuel, PolicyViolation
from hybrid.policy import Budget
from hybrid.results import Termination


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "app.py").write_text(
        "import os\n\ndef main():\n    return os.getenv('HOME')\n"
    )
    (tmp_path / "src" / "pkg" / "util.py").write_text("# TODO: remove\nvalue = 'héllo TODO'\n")
    (tmp_path / "notes.md").write_text("todo list\nnothing here\n")
    (tmp_path / "blob.bin").write_bytes(b"TODO\x00\x01\x02")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("TODO in git internals\n")
    return tmp_path


def test_matches_with_line_column_and_context(tree: Path) -> None:
    report = grep("TODO", tree, context=1)
    assert report.ok and report.found
    assert [(m.path, m.line, m.column) for m in report.matches] == [
        ("src/pkg/util.py", 1, 3),
        ("src/pkg/util.py", 2, 16),
    ]
    second = report.matches[1]
    assert second.before == ["# TODO: remove"] and second.after == []
    assert report.binary_skipped == 1  # blob.bin; .git is never searched
    assert report.files_matched == 1


def test_ignore_case_glob_and_max(tree: Path) -> None:
    report = grep("todo", tree, ignore_case=True, globs=["*.md"])
    assert [m.path for m in report.matches] == ["notes.md"]
    report = grep("todo", tree, ignore_case=True, max_matches=2)
    assert len(report.matches) == 2 and report.truncated
    report = grep(r"os\.\w+", tree, globs=["src/**/*.py"])
    assert [(m.path, m.match) for m in report.matches] == [("src/app.py", "os.getenv")]


def test_single_file_and_no_match(tree: Path) -> None:
    report = grep("def", tree / "src" / "app.py")
    assert [(m.path, m.line) for m in report.matches] == [("app.py", 3)]
    report = grep("absent-string", tree)
    assert report.ok and not report.found and report.files_scanned == 3


def test_invalid_pattern(tree: Path, hybrid_cli) -> None:
    with pytest.raises(InvalidPattern, match="unclosed group"):
        grep("(unclosed", tree)
    code, out, err = hybrid_cli("check", "grep", "[z-a]", str(tree))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("hybrid: error: invalid pattern")


def test_pattern_too_large_is_refused_not_compiled(tree: Path) -> None:
    with pytest.raises(InvalidPattern, match="too large"):
        grep(r"\w{1000}{1000}", tree)


def test_missing_directory(tmp_path: Path, hybrid_cli) -> None:
    with pytest.raises(InvalidInput, match="no such file or directory"):
        grep("x", tmp_path / "absent")
    code, _, err = hybrid_cli("check", "grep", "x", str(tmp_path / "absent"))
    assert code == 2 and "no such file or directory" in err


def test_secret_directories_are_refused_by_policy() -> None:
    with pytest.raises(PolicyViolation, match="host secret path"):
        grep("x", Path.home())


def test_catastrophic_pattern_is_linear(tmp_path: Path) -> None:
    (tmp_path / "long.txt").write_text("a" * 50_000 + "!\n")
    start = time.perf_counter()
    report = grep("(a+)+$", tmp_path, budget=Budget(wall_seconds=10))
    elapsed = time.perf_counter() - start
    assert report.termination is Termination.OK
    assert not report.found
    assert elapsed < 2, f"linear-time engine took {elapsed:.2f}s"


def test_fuel_budget_stops_a_long_search(tmp_path: Path, hybrid_cli) -> None:
    (tmp_path / "big.txt").write_text(("ab" * 200 + "\n") * 5000)
    report = grep(r"(\w+\s?)*x$", tmp_path, budget=Budget(fuel=2_000_000, wall_seconds=10))
    assert report.termination is Termination.OUT_OF_FUEL
    assert not report.ok and report.matches == []
    with pytest.raises(OutOfFuel):
        report.raise_for_termination()
    code, _, err = hybrid_cli("check", "grep", r"(\w+\s?)*x$", str(tmp_path), "--fuel", "2000000")
    assert code == 4
    assert "out_of_fuel" in err


def test_cli_output_format(tree: Path, hybrid_cli) -> None:
    code, out, err = hybrid_cli("check", "grep", "getenv", str(tree), "-C", "1")
    assert code == 0
    assert "src/app.py:4:15:    return os.getenv('HOME')" in out
    assert "src/app.py-3-def main():" in out
    assert "1 matching lines" in err
    code, out, _ = hybrid_cli("check", "grep", "nomatch-xyz", str(tree))
    assert code == 1 and out == ""


def test_cli_prints_paths_as_the_user_gave_them(
    tree: Path, hybrid_cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check grep X DIR` prints DIR/relative paths (usable as typed), a file by its own name."""
    monkeypatch.chdir(tree.parent)
    given = f"{tree.name}/src"
    code, out, _ = hybrid_cli("check", "grep", "getenv", given)
    assert code == 0 and out.splitlines() == [f"{given}/app.py:4:15:    return os.getenv('HOME')"]
    code, out, _ = hybrid_cli("check", "grep", "getenv", given + "/")
    assert out.splitlines()[0].startswith(f"{given}/app.py:4:")
    code, out, _ = hybrid_cli("check", "grep", "getenv", f"./{given}/app.py")
    assert out.splitlines() == [f"./{given}/app.py:4:15:    return os.getenv('HOME')"]
    monkeypatch.chdir(tree)
    code, out, _ = hybrid_cli("check", "grep", "getenv")  # no DIRECTORY: relative to .
    assert out.splitlines()[0].startswith("src/app.py:4:15:")
    assert Path(out.split(":")[0]).is_file()


def test_deadline_stops_a_long_search(tmp_path: Path) -> None:
    for i in range(3):  # about 0.3 s of searching in all
        (tmp_path / f"big{i}.txt").write_text(("ab" * 200 + "\n") * 30000)
    start = time.perf_counter()
    report = grep(r"(\w+\s?)*x$", tmp_path, budget=Budget(wall_seconds=0.03, fuel=10**12))
    assert time.perf_counter() - start < 5
    assert report.termination is Termination.TIMEOUT
    assert not report.ok and report.matches == []


def test_empty_file_has_no_lines(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "two.txt").write_text("x\n\ny\n")
    report = grep("^$", tmp_path)
    assert [(m.path, m.line) for m in report.matches] == [("two.txt", 2)]
