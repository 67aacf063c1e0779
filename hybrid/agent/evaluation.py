"""``hybrid eval``: HumanEval-format problems through the loop, scored with unbiased pass@k.

Each sample is one whole loop run (up to ``steps`` model rounds with evidence in between), so
pass@k here measures the loop, not a single completion. The harness is proven by three models
that need no endpoint: ``oracle`` answers the canonical solution (100%), ``null`` answers
nothing useful (0%), ``wrong-then-right`` fails once and then answers the canonical solution
(every problem solved at step 2).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from math import comb
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybrid.agent.limits import LoopBudget
from hybrid.agent.loop import FunctionTask, Mode, RepoTask, RunReport, solve
from hybrid.agent.models import Model, ScriptedModel
from hybrid.errors import InvalidInput
from hybrid.paths import display, read_input

Item = TypeVar("Item")

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
                f"{display(path)}:{number}: not a HumanEval problem (task_id, prompt, test, entry_point)"
            ) from None
    if not problems:
        raise InvalidInput(f"{display(path)}: no problems")
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
    ray: str | None = None,
) -> EvalResult:
    """Run every problem ``samples`` times through the loop and score pass@k (``ray``: across
    the Ray cluster at that address)."""
    spent = budget or LoopBudget(steps=3)

    def sample(problem: Problem, model: Model) -> tuple[RunReport, bool, str]:
        report = solve(task_for(problem), model, budget=spent, mode=mode)
        return report, report.solved, report.stop.value

    return _score(
        [(p.task_id, p) for p in problems], model_for, sample, samples, ks, progress, "solved", ray
    )


@dataclass(frozen=True)
class _Sample(Generic[Item]):
    """One loop run of one item: a job ``fan_out`` can send to a node as it is."""

    sample: Callable[[Item, Model], tuple[RunReport, bool, str]]
    item: Item
    model: Model

    def run(self) -> tuple[RunReport, bool, str]:
        return self.sample(self.item, self.model)


def _score(
    items: Sequence[tuple[str, Item]],
    model_for: Callable[[Item], Model],
    sample: Callable[[Item, Model], tuple[RunReport, bool, str]],
    samples: int,
    ks: Sequence[int],
    progress: Callable[[str], None] | None,
    verb: str,
    ray: str | None = None,
) -> EvalResult:
    """Run each item ``samples`` times (``sample`` says whether it passed and how it stopped)
    and score pass@k, tokens, cost and the step each pass came at. With ``ray`` (a cluster
    address) the runs spread across the cluster's nodes (hybrid.fanout); each gets its own
    copy of its model."""
    say = progress or (lambda message: None)
    for k in ks:
        if k < 1 or k > samples:
            raise InvalidInput(f"pass@{k} needs 1 <= k <= samples ({samples})")
    runs: list[_Sample[Item]] = []
    for _, item in items:
        runs += [_Sample(sample, item, model_for(item)) for _ in range(samples)]
    if ray is not None:
        from hybrid.fanout import fan_out

        outcomes: Iterator[tuple[RunReport, bool, str]] = fan_out(runs, ray, chunk=1)
    else:
        outcomes = (run.run() for run in runs)
    results: list[ProblemResult] = []
    tokens, cost, name = 0, 0.0, ""
    by_step: dict[int, int] = {}
    for index, (item_id, _) in enumerate(items):
        steps: list[int | None] = []
        stops: list[str] = []
        for run in runs[index * samples : (index + 1) * samples]:
            name = run.model.name
            report, passed, stop = next(outcomes)
            tokens += report.meter.usage.total
            cost += report.meter.cost_usd
            step = len(report.attempts) if passed else None
            steps.append(step)
            stops.append(stop)
            if step is not None:
                by_step[step] = by_step.get(step, 0) + 1
        solved = sum(s is not None for s in steps)
        say(f"{item_id}: {solved}/{samples} {verb}")
        results.append(
            ProblemResult(task_id=item_id, samples=samples, solved=solved, steps=steps, stops=stops)
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
    "RepoInstance",
    "builtin_model",
    "builtin_repo_model",
    "evaluate",
    "evaluate_repo",
    "load_instances",
    "load_problems",
    "pass_at_k",
    "task_for",
]


class RepoInstance(BaseModel):
    """A repository task from a real fix commit (SWE-bench-like, on a local checkout).

    ``repo`` is the checkout at the fix's parent (relative to the instance file); the task
    passes when ``test_command`` with the FAIL_TO_PASS tests and with the PASS_TO_PASS tests
    both pass in the gate. ``patch`` is the real fix (the oracle's answer), inline or a file.
    """

    model_config = ConfigDict(extra="ignore")

    instance_id: str
    repo: Path
    problem_statement: str
    patch: str
    test_command: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)

    def task(self, checkout: Path) -> RepoTask:
        regression = (
            f"{self.test_command} {' '.join(self.PASS_TO_PASS)}" if self.PASS_TO_PASS else None
        )
        return RepoTask(
            task=self.problem_statement,
            repo=checkout,
            test=f"{self.test_command} {' '.join(self.FAIL_TO_PASS)}",
            regression=regression,
        )


def load_instances(path: Path) -> list[RepoInstance]:
    instances = []
    text = read_input(path, "instance file").decode("utf-8", "replace")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            instance = RepoInstance.model_validate(json.loads(line))
        except (ValueError, ValidationError):
            raise InvalidInput(
                f"{display(path)}:{number}: not a repository instance (instance_id, repo, "
                "problem_statement, patch, test_command, FAIL_TO_PASS)"
            ) from None
        base = path.parent
        patch_file = base / instance.patch
        if "\n" not in instance.patch and patch_file.is_file():
            instance.patch = patch_file.read_text()
        instance.repo = base / instance.repo
        if not instance.repo.is_dir():
            raise InvalidInput(
                f"{display(path)}:{number}: {display(instance.repo)} is not a directory"
            )
        instances.append(instance)
    if not instances:
        raise InvalidInput(f"{display(path)}: no instances")
    return instances


def builtin_repo_model(kind: str, instance: RepoInstance) -> Model:
    """Reference models for a repository instance: the real fix, nothing, or a broken fix first."""
    right = f"```diff\n{instance.patch}```"
    if kind == "oracle":
        return ScriptedModel([right] * 50, name="oracle")
    if kind == "null":
        return ScriptedModel(["I made no change."] * 50, name="null")
    if kind == "wrong-then-right":
        lines = instance.patch.splitlines(keepends=True)
        # The fix without its added lines: it applies, and the FAIL_TO_PASS tests still fail.
        broken = "".join(
            line for line in lines if not (line.startswith("+") and not line.startswith("+++"))
        )
        broken = _recount(broken)
        return ScriptedModel([f"```diff\n{broken}```", right] * 25, name="wrong-then-right")
    raise InvalidInput(f"unknown built-in model {kind!r} (one of {', '.join(BUILTIN_MODELS)})")


def _recount(diff: str) -> str:
    """Fix the hunk headers' new-side counts after lines were dropped from a diff."""
    out: list[str] = []
    header_at: int | None = None
    old = new = 0
    for line in diff.splitlines(keepends=True):
        if line.startswith("@@"):
            if header_at is not None:
                out[header_at] = _header(out[header_at], old, new)
            header_at, old, new = len(out), 0, 0
        elif (
            header_at is not None
            and line[:1] in (" ", "-", "+")
            and not line.startswith(("---", "+++"))
        ):
            old += line[0] in " -"
            new += line[0] in " +"
        out.append(line)
    if header_at is not None:
        out[header_at] = _header(out[header_at], old, new)
    return "".join(out)


def _header(line: str, old: int, new: int) -> str:
    import re

    match = re.match(r"@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@(.*)", line, re.S)
    if match is None:
        return line
    return f"@@ -{match[1]},{old} +{match[2]},{new} @@{match[3]}"


def _checkout(source: Path, into: Path) -> Path:
    """A git work tree copy of ``source`` (its own history if it has one, else one commit)."""
    import shutil

    from hybrid import git

    target = into / source.name
    shutil.copytree(source, target, symlinks=True)
    if not (target / ".git").exists():
        env = {
            "GIT_AUTHOR_NAME": "hybrid",
            "GIT_AUTHOR_EMAIL": "eval@hybrid.invalid",
            "GIT_COMMITTER_NAME": "hybrid",
            "GIT_COMMITTER_EMAIL": "eval@hybrid.invalid",
        }
        # A repository made here: no hooks, no configuration but git's defaults.
        for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
            git.run_own(argv, cwd=target, env=env, check=True)
    return target


def evaluate_repo(
    instances: Sequence[RepoInstance],
    model_for: Callable[[RepoInstance], Model],
    *,
    samples: int = 1,
    ks: Sequence[int] = (1,),
    budget: LoopBudget | None = None,
    mode: Mode = "retry",
    progress: Callable[[str], None] | None = None,
    ray: str | None = None,
) -> EvalResult:
    """Repository instances through the loop; solved means the gate said ready for review.

    With ``ray`` the runs spread across that Ray cluster; each node needs the instances'
    checkouts at the same paths (a shared file system)."""
    import tempfile

    spent = budget or LoopBudget(steps=3)

    def sample(instance: RepoInstance, model: Model) -> tuple[RunReport, bool, str]:
        with tempfile.TemporaryDirectory(prefix="hybrid-eval-") as tmp:
            checkout = _checkout(instance.repo, Path(tmp))
            report = solve(instance.task(checkout), model, budget=spent, mode=mode)
        ready = report.solved and report.gate is not None and report.gate.ready
        return report, ready, report.stop.value if report.solved is ready else "gate_blocked"

    return _score(
        [(i.instance_id, i) for i in instances],
        model_for,
        sample,
        samples,
        ks,
        progress,
        "ready for review",
        ray,
    )
