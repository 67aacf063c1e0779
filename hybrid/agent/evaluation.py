"""``hybrid eval``: HumanEval-format problems through the loop, scored with unbiased pass@k.

Each sample is one whole loop run (up to ``steps`` model rounds with evidence in between), so
pass@k here measures the loop, not a single completion. The harness is proven by three models
that need no endpoint: ``oracle`` answers the canonical solution (100%), ``null`` answers
nothing useful (0%), ``wrong-then-right`` fails once and then answers the canonical solution
(every problem solved at step 2).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from math import comb
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from hybrid.agent.limits import LoopBudget
from hybrid.agent.loop import FunctionTask, Mode, solve
from hybrid.agent.models import Model, ScriptedModel
from hybrid.errors import InvalidInput
from hybrid.paths import read_input

BUILTIN_MODELS = ("oracle", "null", "wrong-then-right")


class Problem(BaseModel):
    """One HumanEval-format line."""

    task_id: str
    prompt: str
    canonical_solution: str = ""
    test: str
    entry_point: str


class ProblemResult(BaseModel):
    task_id: str
    samples: int
    solved: int
    steps: list[int | None] = Field(description="Per sample: the step that solved it, or None.")
    stops: list[str]


class EvalResult(BaseModel):
    model: str
    problems: int
    samples: int
    pass_at: dict[int, float] = Field(description="k -> unbiased pass@k over the problems.")
    solved_at_step: dict[int, int] = Field(description="step -> samples solved at that step.")
    tokens: int
    cost_usd: float
    results: list[ProblemResult]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise InvalidInput(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def load_problems(path: Path) -> list[Problem]:
    problems = []
    text = read_input(path, "problem file").decode("utf-8", "replace")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            problems.append(Problem.model_validate(json.loads(line)))
        except (ValueError, ValidationError):
            raise InvalidInput(
                f"{path}:{number}: not a HumanEval problem (task_id, prompt, test, entry_point)"
            ) from None
    if not problems:
        raise InvalidInput(f"{path}: no problems")
    return problems


def task_for(problem: Problem) -> FunctionTask:
    """The problem as a function task: HumanEval's ``check`` called from one test function."""
    tests = (
        f"{problem.test}\n\ndef test_{problem.entry_point}():\n    check({problem.entry_point})\n"
    )
    prompt = (
        f"Complete this function; answer with the whole module.\n```python\n{problem.prompt}```"
    )
    return FunctionTask(prompt=prompt, tests=tests)


def _module(code: str) -> str:
    return f"```python\n{code}```"


def builtin_model(kind: str, problem: Problem) -> Model:
    """The harness's reference models for one problem."""
    right = _module(problem.prompt + problem.canonical_solution)
    if kind == "oracle":
        return ScriptedModel([right] * 50, name="oracle")
    if kind == "null":
        return ScriptedModel([_module("# no answer\n")] * 50, name="null")
    if kind == "wrong-then-right":
        wrong = _module(problem.prompt + "    raise NotImplementedError\n")
        return ScriptedModel([wrong, right] * 25, name="wrong-then-right")
    raise InvalidInput(f"unknown built-in model {kind!r} (one of {', '.join(BUILTIN_MODELS)})")


def evaluate(
    problems: Sequence[Problem],
    model_for: Callable[[Problem], Model],
    *,
    samples: int = 1,
    ks: Sequence[int] = (1,),
    budget: LoopBudget | None = None,
    mode: Mode = "retry",
    progress: Callable[[str], None] | None = None,
) -> EvalResult:
    """Run every problem ``samples`` times through the loop and score pass@k."""
    say = progress or (lambda message: None)
    budget = budget or LoopBudget(steps=3)
    for k in ks:
        if k < 1 or k > samples:
            raise InvalidInput(f"pass@{k} needs 1 <= k <= samples ({samples})")
    results: list[ProblemResult] = []
    tokens, cost, name = 0, 0.0, ""
    by_step: dict[int, int] = {}
    for problem in problems:
        steps: list[int | None] = []
        stops: list[str] = []
        for _ in range(samples):
            model = model_for(problem)
            name = model.name
            report = solve(task_for(problem), model, budget=budget, mode=mode)
            tokens += report.meter.usage.total
            cost += report.meter.cost_usd
            step = len(report.attempts) if report.solved else None
            steps.append(step)
            stops.append(report.stop.value)
            if step is not None:
                by_step[step] = by_step.get(step, 0) + 1
        solved = sum(s is not None for s in steps)
        say(f"{problem.task_id}: {solved}/{samples} solved")
        results.append(
            ProblemResult(
                task_id=problem.task_id, samples=samples, solved=solved, steps=steps, stops=stops
            )
        )
    pass_at = {
        k: sum(pass_at_k(r.samples, r.solved, k) for r in results) / len(results) for k in ks
    }
    return EvalResult(
        model=name,
        problems=len(results),
        samples=samples,
        pass_at=pass_at,
        solved_at_step=dict(sorted(by_step.items())),
        tokens=tokens,
        cost_usd=cost,
        results=results,
    )


__all__ = [
    "BUILTIN_MODELS",
    "EvalResult",
    "Problem",
    "ProblemResult",
    "builtin_model",
    "evaluate",
    "load_problems",
    "pass_at_k",
    "task_for",
]
