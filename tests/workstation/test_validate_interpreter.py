"""Commits the image's Python cannot judge (real engine, real packages, a real Debian bullseye
image with Python 3.9): a project whose pins name a pytest that cannot run on Python 3.11
(parso's ``pytest<6``) is a dependency failure, and a test importing what Python 3.10 removed
(``collections.Mapping``) is the interpreter's; each validates on the older Python."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from hybrid.policy import SandboxSpec
from hybrid.validate import RUNNER_BROKEN, validate
from hybrid.workstation import images
from hybrid.workstation.docker import client

ENV = {
    "PATH": "/usr/bin:/bin",
    "GIT_AUTHOR_NAME": "hybrid",
    "GIT_AUTHOR_EMAIL": "test@hybrid.invalid",
    "GIT_COMMITTER_NAME": "hybrid",
    "GIT_COMMITTER_EMAIL": "test@hybrid.invalid",
}
pytestmark = [pytest.mark.engine, pytest.mark.slow]
SPEC = SandboxSpec.model_validate(
    {"tier": "docker", "budget": {"wall_seconds": 300, "memory": "1G", "pids": 256}}
)
BUGGY = "def double(x):\n    return x + x + 1\n"
FIXED = "def double(x):\n    return x + x\n"
TEST = """from calc import double
{extra}

def test_double():
    assert double(2) == 4
"""


def _repo(root: Path, pyproject: str, extra: str = "") -> tuple[Path, str]:
    """A parent with the bug, and a commit adding its test and fixing it."""
    repo = root / "calc"
    (repo / "tests").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(pyproject)
    (repo / "calc.py").write_text(BUGGY)
    (repo / "tests" / "test_other.py").write_text("def test_other():\n    assert True\n")

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=repo, env=ENV, capture_output=True, text=True, check=True
        ).stdout

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "calc")
    (repo / "calc.py").write_text(FIXED)
    (repo / "tests" / "test_calc.py").write_text(TEST.format(extra=extra))
    git("add", "-A")
    git("commit", "-qm", "fix double")
    return repo, git("rev-parse", "HEAD").strip()


@pytest.fixture(scope="module")
def bullseye(engine):  # type: ignore[no-untyped-def]
    """Debian bullseye's image (Python 3.9): the engine's own, or built here and removed after."""
    tag = images.profile_tag("python", "bullseye")
    present = images.get(tag) is not None
    try:
        images.bootstrap(tag, suite="bullseye")
    except Exception as exc:  # no debootstrap, not root: the engine cannot have this Python
        pytest.skip(f"no bullseye image: {exc}")
    yield tag
    if not present:
        with contextlib.suppress(Exception):
            client().api.remove_image(tag, force=True)


def test_a_runner_that_cannot_run_on_the_python_is_a_dependency_failure(
    engine, bullseye: str, tmp_path: Path
) -> None:
    repo, commit = _repo(
        tmp_path,
        '[project]\nname = "calc"\nversion = "1.0"\noptional-dependencies.test = ["pytest<6"]\n',
    )
    here = validate(repo, commit, spec=SPEC, interpreters=[])
    assert not here.validated
    assert here.failure == "dependency", (here.failure, here.reason)
    assert here.reason.startswith(RUNNER_BROKEN), here.reason
    older = validate(repo, commit, spec=SPEC, interpreters=[bullseye])
    assert older.validated, (older.failure, older.reason)
    assert older.image == bullseye
    assert older.fail_to_pass == ["tests/test_calc.py::tests.test_calc::test_double"]


def test_tests_using_what_the_python_removed_are_the_interpreters(
    engine, bullseye: str, tmp_path: Path
) -> None:
    repo, commit = _repo(
        tmp_path,
        '[project]\nname = "calc"\nversion = "1.0"\n',
        extra="from collections import Mapping  # removed in Python 3.10",
    )
    here = validate(repo, commit, spec=SPEC, interpreters=[])
    assert not here.validated
    assert here.failure == "interpreter", (here.failure, here.reason)
    older = validate(repo, commit, spec=SPEC, interpreters=[bullseye])
    assert older.validated, (older.failure, older.reason)
    assert older.image == bullseye


def test_the_gate_runs_the_tests_where_their_runner_runs(bullseye: str, tmp_path: Path) -> None:
    # The same project at its fix's task (the test committed, the bug still there): on the base
    # image its pinned pytest cannot run; the gate tries the older Python, as validate does.
    from hybrid.agent.gate import BLOCKED, READY, gate
    from hybrid.workstation.images import BASE_IMAGE

    repo, _ = _repo(
        tmp_path,
        '[project]\nname = "calc"\nversion = "1.0"\noptional-dependencies.test = ["pytest<6"]\n',
    )
    subprocess.run(["git", "reset", "-q", "--soft", "HEAD~1"], cwd=repo, env=ENV, check=True)
    (repo / "calc.py").write_text(BUGGY)
    subprocess.run(["git", "add", "-A"], cwd=repo, env=ENV, check=True)
    subprocess.run(["git", "commit", "-qm", "task"], cwd=repo, env=ENV, check=True)
    fix = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def double(x):\n-    return x + x + 1\n+    return x + x\n"
    command = "python3 -m pytest -q -p no:cacheprovider tests/test_calc.py"
    report = gate(fix, repo, test=command, spec=SPEC)
    assert report.disposition == READY, report.reasons
    pinned = gate(fix, repo, test=command, spec=SPEC, image=BASE_IMAGE)  # named: no other
    assert pinned.disposition == BLOCKED
