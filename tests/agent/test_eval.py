"""The evaluation harness, proven by models with known answers (real python-wasm runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid.agent.evaluation import builtin_model, evaluate, load_problems, pass_at_k
from hybrid.errors import InvalidInput

ROOT = Path(__file__).parents[2]
PROBLEMS = Path(__file__).parent / "data" / "humaneval-sample.jsonl"


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 4, 2) == 1.0
    with pytest.raises(InvalidInput):
        pass_at_k(1, 1, 2)


@pytest.mark.parametrize(
    ("kind", "rate", "steps"),
    [("oracle", 1.0, {1: 8}), ("null", 0.0, {}), ("wrong-then-right", 1.0, {2: 8})],
)
def test_reference_models_prove_the_harness(kind: str, rate: float, steps: dict) -> None:
    problems = load_problems(PROBLEMS)
    result = evaluate(problems, lambda p: builtin_model(kind, p), samples=2, ks=(1, 2))
    assert result.pass_at == {1: rate, 2: rate}
    assert result.solved_at_step == steps
    if kind == "null":
        assert all(stop == "repeated_edit" for r in result.results for stop in r.stops)


def test_a_broken_problem_file_is_one_line_of_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x"}\n')
    with pytest.raises(InvalidInput, match=r"bad\.jsonl:1"):
        load_problems(bad)


def test_eval_cli_json() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hybrid",
            "eval",
            str(PROBLEMS),
            "--builtin",
            "oracle",
            "--json",
            "-q",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["pass_at"] == {"1": 1.0} and payload["problems"] == 4
