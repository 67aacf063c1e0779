"""Per-iteration overhead of the generate-execute-debug loop, model time excluded.

An iteration is everything a step does besides waiting for the model: read the answer, run the
candidate in its sandbox with its tests, build the evidence (describe, redact, bound, wrap),
the breaker and the budgets. The model is a scripted one (microseconds), and each step's model
time is subtracted anyway.

* function tasks: the issue's shipping task in python-wasm, a failing candidate per step (the
  full evidence path) and a passing one (no evidence).
* repository tasks (needs the Docker engine; --no-repo skips): the vendored humanize fix commit
  (tests/agent/data), a wrong patch per step: context pack once, then per step patch parse,
  scope + secret scan, fork, apply, the test command, evidence. Shown beside the test
  command's own time.

    python benchmarks/loop.py [--iterations 200] [--repo-iterations 5] [--no-repo]

Target (issue 11): function-task overhead p50 <= 10 ms; repository overhead <= the test
command's own time + 300 ms.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hybrid import git  # noqa: E402
from hybrid.agent.limits import LoopBudget  # noqa: E402
from hybrid.agent.loop import FunctionTask, RepoTask, RunReport, solve  # noqa: E402
from hybrid.agent.models import ScriptedModel  # noqa: E402

SHIPPING = ROOT / "tests" / "python_wasm" / "shipping"
HUMANIZE = ROOT / "tests" / "agent" / "data" / "humanize-823ad60"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def fenced(code: str) -> str:
    return f"```python\n{code}```"


def function_rows(iterations: int) -> list[tuple[str, list[float], list[float]]]:
    task = FunctionTask(
        prompt="write calculate_shipping(weight_kg, zone) reading rate_card.csv",
        tests=(SHIPPING / "tests.py").read_text(),
        files={"rate_card.csv": (SHIPPING / "rate_card.csv").read_text()},
    )
    wrong = (SHIPPING / "attempt1.py").read_text()
    right = (SHIPPING / "attempt2.py").read_text()
    unlimited = LoopBudget(steps=iterations + 1, repeats=iterations + 10)
    solve(task, ScriptedModel([fenced(right)]))  # warm: guest loaded, tests compiled
    # Distinct edits (a comment), the same failure: the breaker is set out of reach.
    failing = [fenced(wrong + f"# variant {i}\n") for i in range(iterations)]
    report = solve(task, ScriptedModel(failing), budget=unlimited)
    fail = [a.overhead_ms for a in report.attempts]
    fail_sandbox = [a.candidates[0].sandbox_ms for a in report.attempts]
    passing, pass_sandbox = [], []
    for _ in range(max(10, iterations // 4)):
        one = solve(task, ScriptedModel([fenced(right)]))
        passing.append(one.attempts[0].overhead_ms)
        pass_sandbox.append(one.attempts[0].candidates[0].sandbox_ms)
    return [
        ("function, failing (evidence)", fail, fail_sandbox),
        ("function, passing", passing, pass_sandbox),
    ]


def repo_rows(iterations: int) -> list[tuple[str, list[float], list[float]]]:
    tmp = Path(tempfile.mkdtemp(prefix="hybrid-bench-loop-"))
    try:
        repo = tmp / "humanize"
        shutil.copytree(HUMANIZE / "before", repo)
        env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.invalid"}
        env |= {"GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@example.invalid"}
        for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "b"]):
            git.run_own(argv, cwd=repo, env=env, check=True)
        fix = (HUMANIZE / "fix.diff").read_text()
        wrong = [
            "```diff\n" + fix.replace("if exp < len(suffix) and", f"if {i} < 0 and") + "```"
            for i in range(iterations)
        ]
        task = RepoTask(
            task="naturalsize() rounding rollover at unit boundaries",
            repo=repo,
            test="PYTHONPATH=src python3 -m pytest -q -p no:cacheprovider tests/test_filesize.py",
        )
        budget = LoopBudget(steps=iterations, repeats=iterations + 10)
        report: RunReport = solve(task, ScriptedModel(wrong), budget=budget)
        overhead = [a.overhead_ms for a in report.attempts]
        tests = [
            a.candidates[0].result.usage.wall_ms
            for a in report.attempts
            if a.candidates[0].result is not None
        ]
        return [("repository, failing (fork+apply+test+evidence)", overhead, tests)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--repo-iterations", type=int, default=5)
    parser.add_argument("--no-repo", action="store_true")
    args = parser.parse_args()
    rows = function_rows(args.iterations)
    if not args.no_repo:
        rows += repo_rows(args.repo_iterations)
    print(
        "| iteration | n | overhead p50 ms | overhead p95 ms | sandbox/test p50 ms | rest p50 ms |"
    )
    print("|---|---|---|---|---|---|")
    for name, overhead, inner in rows:
        rest = [o - i for o, i in zip(overhead, inner, strict=False)]
        print(
            f"| {name} | {len(overhead)} | {statistics.median(overhead):.1f} | "
            f"{pct(overhead, 0.95):.1f} | {statistics.median(inner):.1f} | "
            f"{statistics.median(rest):.1f} |"
        )
    print(
        "\n'sandbox/test' is the candidate's own run (python-wasm run with its tests; for a "
        "repository, the test command's exec); 'rest' is everything else in the step."
    )


if __name__ == "__main__":
    main()
