"""The loop on function tasks, for real: every candidate runs in python-wasm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybrid.agent.limits import LoopBudget, StopReason
from hybrid.agent.loop import FunctionTask, solve
from hybrid.agent.models import Completion, ScriptedModel, Usage

ROOT = Path(__file__).parents[2]
SHIPPING = ROOT / "tests" / "python_wasm" / "shipping"
PROMPT = "write `calculate_shipping(weight_kg, zone)` that reads `rate_card.csv` and returns the cost in USD"


def fenced(code: str) -> str:
    return f"Here is the module:\n```python\n{code}```\n"


def shipping_task() -> FunctionTask:
    return FunctionTask(
        prompt=PROMPT,
        tests=(SHIPPING / "tests.py").read_text(),
        files={"rate_card.csv": (SHIPPING / "rate_card.csv").read_text()},
    )


WRONG = fenced((SHIPPING / "attempt1.py").read_text())
RIGHT = fenced((SHIPPING / "attempt2.py").read_text())


def test_the_shipping_task_is_fixed_at_step_two_and_ready_for_review(tmp_path: Path) -> None:
    model = ScriptedModel([WRONG, RIGHT])
    report = solve(shipping_task(), model, bundle=tmp_path / "bundle")
    assert report.stop is StopReason.SOLVED and report.solved
    assert [len(a.candidates) for a in report.attempts] == [1, 1]
    first = report.attempts[0].candidates[0]
    assert not first.passed
    # The evidence names the missing column, is wrapped as untrusted and went to the model.
    assert "KeyError: 'weight_kg'" in first.evidence
    assert first.evidence.startswith("<untrusted-evidence")
    assert first.evidence.rstrip().endswith("</untrusted-evidence>")
    assert len(first.evidence.encode()) < 8 * 1024
    assert 'File "solution.py"' in first.evidence and "app.py" not in first.evidence
    second_prompt = model.calls[1][-1].content
    assert first.evidence in second_prompt
    assert report.attempts[1].candidates[0].passed
    assert report.solution is not None and 'row["weight"]' in report.solution
    assert report.gate is not None and report.disposition == "ready for human review"
    saved = json.loads((tmp_path / "bundle" / "run.json").read_text())
    assert saved["stop"] == "solved" and len(saved["attempts"]) == 2
    markdown = (tmp_path / "bundle" / "report.md").read_text()
    assert "KeyError: 'weight_kg'" in markdown and "ready for human review" in markdown


def test_secrets_printed_by_a_candidate_are_redacted_in_the_evidence() -> None:
    leaky = fenced(
        "print('AWS key AKIAIOSFODNN7EXAMPLE')\n"
        "print('x' * 100000)\n"
        "def calculate_shipping(w, z):\n    return 0\n"
    )
    report = solve(shipping_task(), ScriptedModel([leaky]), budget=LoopBudget(steps=1))
    assert report.stop is StopReason.STEPS
    evidence = report.attempts[0].candidates[0].evidence
    assert "AKIAIOSFODNN7EXAMPLE" not in evidence
    assert "assert 0 == 12.5" in evidence  # both sides of the failed comparison
    assert len(evidence.encode()) < 8 * 1024


def test_the_same_wrong_answer_trips_the_breaker_at_the_third() -> None:
    model = ScriptedModel([WRONG] * 5)
    report = solve(shipping_task(), model, budget=LoopBudget(steps=10))
    assert report.stop is StopReason.REPEATED_EDIT
    assert len(report.attempts) == 3 and len(model.calls) == 3


def test_the_same_failure_three_times_in_a_row_trips_the_breaker() -> None:
    variants = [WRONG.replace("weight_kg, zone", f"weight_kg, zone, _v={i}") for i in range(5)]
    report = solve(shipping_task(), ScriptedModel(variants), budget=LoopBudget(steps=10))
    assert report.stop is StopReason.REPEATED_FAILURE and len(report.attempts) == 3


def test_a_token_budget_stops_the_run_before_it_is_exceeded() -> None:
    unlimited = solve(shipping_task(), ScriptedModel([WRONG, WRONG + "#", RIGHT]))
    used = [c.usage.total for a in unlimited.attempts for c in a.candidates]
    limit = used[0] + used[1] - 1  # the second call only fits cut short; no third
    model = ScriptedModel([WRONG, WRONG + "#", RIGHT])
    report = solve(shipping_task(), model, budget=LoopBudget(steps=10, tokens=limit))
    assert report.stop is StopReason.TOKENS
    assert 0 < report.meter.usage.total <= limit
    assert len(model.calls) == 2


def test_other_budgets_stop_with_their_reason() -> None:
    costly = Completion(text=WRONG, usage=Usage(input_tokens=10, output_tokens=10), cost_usd=0.6)
    report = solve(
        shipping_task(), ScriptedModel([costly] * 3), budget=LoopBudget(steps=10, cost_usd=1.0)
    )
    assert report.stop is StopReason.COST and report.meter.cost_usd == pytest.approx(1.2)
    report = solve(shipping_task(), ScriptedModel([WRONG]), budget=LoopBudget(steps=5))
    assert report.stop is StopReason.MODEL_EXHAUSTED
    report = solve(
        shipping_task(),
        ScriptedModel([WRONG, WRONG + "#"]),
        budget=LoopBudget(steps=5, sandbox_seconds=0.001),
    )
    assert report.stop is StopReason.SANDBOX_TIME and len(report.attempts) == 1


def test_explain_then_fix_keeps_the_hypothesis() -> None:
    hypothesis = "The CSV header is `weight`, not `weight_kg`, so the lookup raises KeyError."
    model = ScriptedModel([WRONG, hypothesis, RIGHT])
    report = solve(shipping_task(), model, mode="explain")
    assert report.solved and report.attempts[1].hypothesis == hypothesis
    assert "hypothesis" in model.calls[1][-1].content


def test_k_candidates_run_in_parallel_and_a_passing_one_wins() -> None:
    report = solve(shipping_task(), ScriptedModel([WRONG, RIGHT]), k=2)
    assert report.solved and len(report.attempts) == 1
    attempt = report.attempts[0]
    assert attempt.winner is not None and attempt.candidates[attempt.winner].passed
    assert 'row["weight"]' in (report.solution or "")


def test_an_answer_without_code_goes_back_as_evidence() -> None:
    model = ScriptedModel(["I cannot do that.", RIGHT])
    report = solve(shipping_task(), model)
    assert report.solved and len(report.attempts) == 2
    assert "SyntaxError" in report.attempts[0].candidates[0].evidence
