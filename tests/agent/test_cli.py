"""`hybrid solve --function` and bad input, as a user meets them; answer parsing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid.agent.edits import MalformedAnswer, extract_code, to_diff

ROOT = Path(__file__).parents[2]
SHIPPING = ROOT / "tests" / "python_wasm" / "shipping"
TASK = "write `calculate_shipping(weight_kg, zone)` that reads `rate_card.csv` and returns the cost in USD"


def hybrid(*args: str, cwd: Path = SHIPPING) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybrid", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )


def test_solve_function_shipping_end_to_end(tmp_path: Path) -> None:
    result = hybrid(
        "solve", "--function", "--task", TASK, "--tests", "tests.py", "--file", "rate_card.csv",
        "--answer", "attempt1.py", "--answer", "attempt2.py", "--bundle", str(tmp_path / "b"),
        "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["stop"] == "solved" and report["gate"]["disposition"] == "ready for human review"
    assert "KeyError: 'weight_kg'" in report["attempts"][0]["candidates"][0]["evidence"]
    assert "step 2: candidate 0 passed" in result.stderr  # live progress
    assert (tmp_path / "b" / "report.md").is_file()


def test_solve_function_unsolved_exits_1(tmp_path: Path) -> None:
    result = hybrid(
        "solve", "--function", "--task", TASK, "--tests", "tests.py", "--file", "rate_card.csv",
        "--answer", "attempt1.py", "--bundle", str(tmp_path / "b"), "-q",
    )  # fmt: skip
    assert result.returncode == 1
    assert "stop: model_exhausted" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["solve", "--function", "--task", "x", "--answer", "attempt1.py"], "needs --tests"),
        (["solve", "--task", "x", "--answer", "attempt1.py"], "needs --repo DIR and --test"),
        (["solve", "--function", "--tests", "tests.py", "--answer", "a.py"], "needs a task"),
        (["solve", "--function", "--task", "x", "--tests", "tests.py"], "name one model"),
        (
            [
                "solve",
                "--function",
                "--task",
                "x",
                "--tests",
                "tests.py",
                "--model",
                "m",
                "--api-key-env",
                "HYBRID_TEST_UNSET_KEY",
            ],
            "HYBRID_TEST_UNSET_KEY",
        ),
        (["solve", "--function", "--task", "x", "--tests", "no.py", "--answer", "a"], "no such"),
        (
            [
                "solve",
                "--function",
                "--task",
                "x",
                "--tests",
                "tests.py",
                "--answer",
                "attempt1.py",
                "--steps",
                "0",
            ],
            "--steps",
        ),
        (["gate", "nonexistent.diff", "--repo", ".", "--test", "true"], "no such patch"),
        (["eval", "nonexistent.jsonl", "--builtin", "oracle"], "no such problem file"),
    ],
)
def test_bad_input_gives_one_line(args: list[str], message: str) -> None:
    result = hybrid(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_answers_are_read_as_code_diff_or_edit_blocks(tmp_path: Path) -> None:
    assert extract_code("text\n```python\nx = 1\n```\nmore") == "x = 1\n"
    assert extract_code("x = 2") == "x = 2"
    (tmp_path / "a.py").write_text("one\ntwo\n")
    diff = to_diff("a.py\n<<<<<<< SEARCH\ntwo\n=======\nthree\n>>>>>>> REPLACE\n", tmp_path)
    assert "-two\n+three\n" in diff and diff.startswith("diff --git a/a.py b/a.py")
    created = to_diff("new.py\n<<<<<<< SEARCH\n=======\nx = 1\n>>>>>>> REPLACE\n", tmp_path)
    assert "new file mode" in created and "+x = 1" in created
    assert to_diff("```diff\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-one\n+1\n```", tmp_path)
    for bad, why in [
        ("no edit here", "neither a unified diff"),
        ("a.py\n<<<<<<< SEARCH\nmissing\n=======\nx\n>>>>>>> REPLACE\n", "does not match"),
        ("../x.py\n<<<<<<< SEARCH\n=======\nx\n>>>>>>> REPLACE\n", "unusable path"),
    ]:
        with pytest.raises(MalformedAnswer, match=why):
            to_diff(bad, tmp_path)
