"""``hybrid py``: the shipping case through the command line, --json, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid.wasm.python import component

SHIPPING = Path(__file__).parent / "shipping"


@pytest.fixture(scope="module", autouse=True)
def guest() -> None:
    component()  # build + compile once (the subprocesses below then load it from the cache)


def hybrid_py(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybrid", "py", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=300,
    )


def shipping_args(attempt: str) -> list[str]:
    return [
        str(SHIPPING / attempt),
        "--test",
        str(SHIPPING / "tests.py"),
        "--file",
        str(SHIPPING / "rate_card.csv"),
    ]


def test_run_first_attempt_fails_with_keyerror() -> None:
    proc = hybrid_py("run", *shipping_args("attempt1.py"))
    assert proc.returncode == 1
    assert 'FAIL assert calculate_shipping(5.0, "zone_3") == 12.50' in proc.stderr
    assert "KeyError: 'weight_kg'" in proc.stderr
    assert 'File "attempt1.py", line 7, in calculate_shipping' in proc.stderr


def test_run_corrected_attempt_passes_json() -> None:
    proc = hybrid_py("run", *shipping_args("attempt2.py"), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["tier"] == "python-wasm"
    assert result["termination"] == "ok"
    assert [t["passed"] for t in result["tests"]] == [True, True]


def test_eval_prints_output() -> None:
    proc = hybrid_py("eval", "import statistics; print(statistics.mean([1, 2, 3]))")
    assert proc.returncode == 0
    assert proc.stdout == "2\n"


def test_eval_reads_stdin_and_budget_options_apply() -> None:
    proc = hybrid_py(
        "eval", "-", "--timeout", "0.3", "--fuel", "10000000000000", stdin="while True: pass"
    )
    assert proc.returncode == 124
    assert "timeout" in proc.stderr
    proc = hybrid_py("eval", "print('x' * 100000)", "--output-bytes", "1K", "--json")
    result = json.loads(proc.stdout)
    assert result["termination"] == "output_limit" and len(result["stdout"]) == 1024


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "/no/such/snippet.py"], "no such file"),
        (["eval", "pass", "--memory", "12Q"], "not a size"),
        (["eval", "pass", "--file", "/no/such/input.csv"], "no such input file"),
        (["eval", "pass", "--memory", "64G"], "maximum"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args: list[str], message: str) -> None:
    proc = hybrid_py(*args)
    assert proc.returncode in (2, 3)
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_modules_lists_the_bundled_stdlib() -> None:
    proc = hybrid_py("modules", "--json")
    assert proc.returncode == 0
    names = json.loads(proc.stdout)
    assert {"csv", "json", "decimal", "unittest"} <= set(names)


def test_the_host_stdin_is_not_inherited() -> None:
    proc = hybrid_py("eval", "import sys; print(repr(sys.stdin.read()))", stdin="HOST SECRET\n")
    assert proc.returncode == 0
    assert proc.stdout == "''\n"
