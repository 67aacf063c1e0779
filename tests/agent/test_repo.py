"""The review gate and repository tasks on the real Docker engine, with a real fix commit of a
public project (python-humanize 823ad60, vendored in data/humanize-823ad60)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hybrid.agent.gate import READY, gate
from hybrid.agent.limits import LoopBudget, StopReason
from hybrid.agent.loop import RepoTask, solve
from hybrid.agent.models import ScriptedModel
from hybrid.policy import Budget, SandboxSpec

DATA = Path(__file__).parent / "data" / "humanize-823ad60"
FIX = (DATA / "fix.diff").read_text()
TEST = "PYTHONPATH=src python3 -m pytest -q -p no:cacheprovider tests/test_filesize.py"
REGRESSION = "PYTHONPATH=src python3 -m pytest -q -p no:cacheprovider tests/test_lists.py"
SPEC = SandboxSpec(tier="docker", budget=Budget(wall_seconds=120, memory="512M", pids=128))
TASK = (
    "naturalsize() rounds after choosing the suffix, so 999999 bytes reads '1000.0 kB' "
    "instead of '1.0 MB'. Fix the rollover at unit boundaries in src/humanize/filesize.py."
)

pytestmark = pytest.mark.engine


@pytest.fixture
def repo(tmp_path: Path, engine) -> Path:  # type: ignore[no-untyped-def]
    """The project at the fix's parent commit, as a git work tree."""
    root = tmp_path / "humanize"
    shutil.copytree(DATA / "before", root)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "base"]):
        subprocess.run(argv, cwd=root, env=env, check=True)
    return root


def test_the_real_fix_is_ready_for_review(repo: Path) -> None:
    runner = "PYTHONPATH=src python3 -m pytest -q -p no:cacheprovider"
    report = gate(FIX, repo, test=TEST, regression=REGRESSION, related=runner, spec=SPEC)
    assert report.disposition == READY, report.reasons
    assert report.files == ["src/humanize/filesize.py"]
    assert [c.name for c in report.checks] == [
        "scope",
        "secrets",
        "dependencies",
        "tests",
        "apply",
        "tree",
        "test",
        "regression",
        "related tests",
    ]
    assert report.checks[-1].detail == "passed (tests/test_filesize.py)"
    assert "step up one suffix" in report.reviewed_diff  # git's result, judged on the host


def test_an_empty_or_wrong_patch_is_blocked_with_the_failing_tests(repo: Path) -> None:
    empty = gate("", repo, test=TEST, spec=SPEC)
    assert empty.disposition == "blocked" and empty.reasons == ["the patch changes nothing"]
    wrong = FIX.replace("if exp < len(suffix) and", "if False and")
    report = gate(wrong, repo, test=TEST, regression=REGRESSION, spec=SPEC)
    assert report.disposition == "blocked"
    assert (
        len(report.reasons) == 1 and "tests/test_filesize.py::test_naturalsize" in report.reasons[0]
    )
    assert next(c for c in report.checks if c.name == "regression").passed


def test_every_reason_is_given_for_env_ci_secret_and_dependency_changes(repo: Path) -> None:
    extra = textwrap.dedent(
        """\
        diff --git a/.env b/.env
        new file mode 100644
        --- /dev/null
        +++ b/.env
        @@ -0,0 +1 @@
        +DEBUG=1
        diff --git a/.github/workflows/ci.yml b/.github/workflows/ci.yml
        new file mode 100644
        --- /dev/null
        +++ b/.github/workflows/ci.yml
        @@ -0,0 +1 @@
        +on: push
        diff --git a/src/humanize/config.py b/src/humanize/config.py
        new file mode 100644
        --- /dev/null
        +++ b/src/humanize/config.py
        @@ -0,0 +1 @@
        +AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
        diff --git a/requirements.txt b/requirements.txt
        new file mode 100644
        --- /dev/null
        +++ b/requirements.txt
        @@ -0,0 +1 @@
        +requests==2.32.3
        """
    )
    report = gate(FIX + extra, repo, test=TEST, spec=SPEC)
    assert report.disposition == "blocked"
    text = "\n".join(report.reasons)
    assert ".env" in text and "env-file" in text
    assert ".github/workflows/ci.yml" in text and "ci-config" in text
    assert "aws_access_key_id" in text and "AKIAIOSFODNN7EXAMPLE" not in text
    assert "requirements.txt" in text and "admission" in text
    assert next(c for c in report.checks if c.name == "test").passed  # blocked for the rest


SEARCH_REPLACE = """I will step up the suffix after rounding.

src/humanize/filesize.py
<<<<<<< SEARCH
    exp = int(min(log(abs_bytes, base), len(suffix)))
=======
    exp = int(min(log(abs_bytes, base), len(suffix)))
    if exp < len(suffix) and abs(float(format % (abs_bytes / (base**exp)))) >= base:
        exp += 1
>>>>>>> REPLACE
"""


def test_solve_a_repository_task_malformed_then_fixed(repo: Path, tmp_path: Path) -> None:
    model = ScriptedModel(["```diff\nthis is not a diff\n```", SEARCH_REPLACE])
    task = RepoTask(task=TASK, repo=repo, test=TEST, regression=REGRESSION, allow=["src/"])
    report = solve(task, model, spec=SPEC, bundle=tmp_path / "bundle")
    assert report.stop is StopReason.SOLVED, report.stop_detail
    first = report.attempts[0].candidates[0]
    assert first.problem is not None and first.problem.startswith("malformed answer")
    assert "untrusted-evidence" in model.calls[1][-1].content
    assert report.gate is not None and report.disposition == READY, report.gate.reasons
    assert any(c.path == "src/humanize/filesize.py" for c in report.context)
    assert "src/humanize/filesize.py" in model.calls[0][1].content  # the pack went to the model
    assert (tmp_path / "bundle" / "report.md").read_text().count("## Step") == 2


def test_solve_sends_failing_tests_back_and_scope_blocks_before_running(repo: Path) -> None:
    wrong = "```diff\n" + FIX.replace("if exp < len(suffix) and", "if False and") + "```"
    env_edit = "```diff\ndiff --git a/.env b/.env\nnew file mode 100644\n--- /dev/null\n+++ b/.env\n@@ -0,0 +1 @@\n+X=1\n```"
    task = RepoTask(task=TASK, repo=repo, test=TEST)
    report = solve(task, ScriptedModel([env_edit, wrong]), spec=SPEC, budget=LoopBudget(steps=2))
    assert report.stop is StopReason.STEPS
    blocked, failed = (a.candidates[0] for a in report.attempts)
    assert blocked.result is None and "env-file" in (blocked.problem or "")
    assert failed.result is not None and not failed.passed
    assert "FAILED tests/test_filesize.py::test_naturalsize" in failed.evidence
    assert report.disposition == "blocked"


CTRL_C = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from hybrid.agent.loop import RepoTask, solve
    from hybrid.agent.models import ScriptedModel
    from hybrid.policy import Budget, SandboxSpec

    diff = Path(sys.argv[2]).read_text()
    task = RepoTask(task="fix it", repo=Path(sys.argv[1]), test="sleep 100")
    spec = SandboxSpec(tier="docker", budget=Budget(wall_seconds=200, memory="256M", pids=64))
    solve(task, ScriptedModel(["```diff\\n" + diff + "```"]), spec=spec,
          bundle=Path(sys.argv[3]), progress=lambda m: print(m, flush=True))
    """
)


def _owned_by(pid: int) -> list[str]:
    from hybrid.workstation.docker import LABEL_OWNER, client

    api = client().api
    rows = api.containers(all=True, filters={"label": LABEL_OWNER})
    volumes = api.volumes(filters={"label": LABEL_OWNER}).get("Volumes") or []
    marks = [r["Labels"].get(LABEL_OWNER, "") for r in rows]
    marks += [v.get("Labels", {}).get(LABEL_OWNER, "") for v in volumes]
    return [m for m in marks if m.split(":")[1:2] == [str(pid)]]


def test_ctrl_c_during_a_candidates_tests_leaves_no_sandbox(repo: Path, tmp_path: Path) -> None:
    (tmp_path / "fix.diff").write_text(FIX)
    child = subprocess.Popen(
        [sys.executable, "-c", CTRL_C, str(repo), str(tmp_path / "fix.diff"), str(tmp_path / "b")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert child.stdout is not None
    try:
        for line in child.stdout:
            if line.startswith("step 1: forking"):
                break
        time.sleep(4)  # the fork is running the test command
        assert _owned_by(child.pid), "the run made no workstation"
        child.send_signal(signal.SIGINT)
        child.wait(120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode != 0
    assert _owned_by(child.pid) == []
    saved = json.loads((tmp_path / "b" / "run.json").read_text())
    assert saved["stop"] == "interrupted"


def test_gate_cli_json_and_exit_codes(repo: Path, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.diff"
    wrong.write_text(FIX.replace("if exp < len(suffix) and", "if False and"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    for patch, code, disposition in ((DATA / "fix.diff", 0, READY), (wrong, 1, "blocked")):
        result = subprocess.run(
            [sys.executable, "-m", "hybrid", "gate", str(patch), "--repo", str(repo),
             "--test", TEST, "--json", "-q"],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert result.returncode == code, result.stderr
        assert json.loads(result.stdout)["disposition"] == disposition


INSTANCES = Path(__file__).parent / "data" / "repo-instances.jsonl"


@pytest.mark.parametrize(
    ("kind", "rate", "steps"),
    [("oracle", 1.0, {1: 1}), ("null", 0.0, {}), ("wrong-then-right", 1.0, {2: 1})],
)
def test_eval_on_a_real_fix_commit(engine, kind: str, rate: float, steps: dict) -> None:  # type: ignore[no-untyped-def]
    from hybrid.agent.evaluation import builtin_repo_model, evaluate_repo, load_instances

    result = evaluate_repo(load_instances(INSTANCES), lambda i: builtin_repo_model(kind, i))
    assert result.pass_at == {1: rate} and result.solved_at_step == steps


def test_eval_cli_detects_repository_instances(engine) -> None:  # type: ignore[no-untyped-def]
    result = subprocess.run(
        [sys.executable, "-m", "hybrid", "eval", str(INSTANCES), "--builtin", "oracle", "--json", "-q"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["pass_at"] == {"1": 1.0}


class _SnapshotWatcher(ScriptedModel):
    """Answers from a script; at each call, notes (and with ``vandal``, untags) the fork
    snapshots this process's runs made. The vandal waits for a snapshot it has not removed yet:
    the forks for a step are made in the background, and a call that came before them would
    see nothing to remove (how this test once passed or failed with the host's speed)."""

    def __init__(self, answers: list[str], vandal: bool = False) -> None:
        super().__init__(answers)
        self.vandal = vandal
        self.seen: set[str] = set()
        self.sources: set[str] = set()

    def complete(self, messages, *, max_tokens=None):  # type: ignore[no-untyped-def]
        from hybrid.workstation.docker import LABEL_OWNER, LABEL_SOURCE, client

        api = client().api
        end = time.monotonic() + 120
        while True:
            ours = {
                row["Labels"].get("hybrid.name", "")
                for row in api.containers(all=True, filters={"label": LABEL_OWNER})
                if row["Labels"].get(LABEL_OWNER, "").split(":")[1:2] == [str(os.getpid())]
            }
            self.sources |= ours
            tagged = {}
            for image in api.images(filters={"label": LABEL_SOURCE}):
                if (image.get("Labels") or {}).get(LABEL_SOURCE) in ours:
                    self.seen.add(image["Id"])
                    tags = [t for t in image.get("RepoTags") or [] if t != "<none>:<none>"]
                    if tags:
                        tagged[image["Id"]] = tags
            if not self.vandal or tagged or time.monotonic() > end:
                break
            time.sleep(0.1)
        for tags in tagged.values() if self.vandal else []:
            for tag in tags:
                api.remove_image(tag, force=True)  # untagged: no longer startable by name
        return super().complete(messages, max_tokens=max_tokens)


def _wrong_answers(n: int) -> list[str]:
    return [
        "```diff\n" + FIX.replace("if exp < len(suffix) and", f"if {i} < 0 and") + "```"
        for i in range(n)
    ]


@pytest.mark.parametrize("vandal", [False, True], ids=["steady", "snapshot-removed"])
def test_every_step_forks_from_one_snapshot_and_survives_losing_it(
    repo: Path, vandal: bool
) -> None:
    model = _SnapshotWatcher(_wrong_answers(3), vandal=vandal)
    task = RepoTask(task=TASK, repo=repo, test=TEST)
    report = solve(task, model, budget=LoopBudget(steps=3, repeats=10), spec=SPEC)
    assert report.stop == StopReason.STEPS, report.stop_detail
    for attempt in report.attempts:  # every step's candidate ran its tests
        result = attempt.candidates[0].result
        assert result is not None and result.exit_code not in (None, 0), attempt
    if vandal:
        assert len(model.seen) >= 3  # each call removed the one in use: a new one was taken
    else:
        assert len(model.seen) == 1  # one snapshot of the repository served every step
    assert _owned_by(os.getpid()) == []
    from hybrid.workstation.docker import LABEL_SOURCE, client

    api = client().api
    left = [
        i
        for i in api.images(filters={"label": LABEL_SOURCE})
        if i["Labels"].get(LABEL_SOURCE) in model.sources
    ]
    if vandal:  # an untagged image cannot be dropped by its name: the vandal's mess
        for image in left:
            api.remove_image(image["Id"], force=True)
    else:
        assert left == []


@pytest.mark.parametrize("size", [100, 200_000], ids=["as-argument", "copied-in"])
def test_a_patch_applies_whatever_its_size(repo: Path, size: int) -> None:
    from hybrid.agent.gate import ARGUMENT_PATCH_BYTES, run_in
    from hybrid.workstation import backend

    lines = [f"line {i} with a backslash \\n, a % sign and 'quotes'" for i in range(size // 50)]
    patch = (
        "diff --git a/notes.txt b/notes.txt\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/notes.txt\n@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{x}\n" for x in lines)
    )
    assert (len(patch) > ARGUMENT_PATCH_BYTES) == (size > ARGUMENT_PATCH_BYTES)
    with backend().create(SPEC, repo=repo) as ws:
        checks = run_in(ws, patch, [("count", "wc -l < notes.txt; git status --porcelain")])
        assert [c.passed for c in checks] == [True, True], checks
        result = checks[-1].result
        assert result is not None
        assert result.stdout.split("\n")[0].strip() == str(len(lines))
        assert "?? notes.txt" in result.stdout  # and no patch file left in the work tree
        assert ws.get("notes.txt") == "".join(f"{x}\n" for x in lines).encode()
