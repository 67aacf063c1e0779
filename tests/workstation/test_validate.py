"""A real fix commit validated end to end (real engine, real packages from the configured index):
humanize 823ad60, vendored in tests/agent/data, replayed as two commits of a fresh git
repository. Its test change fails at the parent and passes with its source change; a commit
whose tests already pass does not validate; nothing is left behind."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hybrid import validate as validate_module
from hybrid.errors import InvalidInput
from hybrid.policy import SandboxSpec
from hybrid.validate import Validation, change_of, is_test, validate
from hybrid.workstation.base import Backend
from hybrid.workstation.docker import LABEL_KIND, LABEL_MANAGED, LABEL_OWNER, client
from hybrid.workstation.docker.labels import _owner

DATA = Path(__file__).parent.parent / "agent" / "data" / "humanize-823ad60"
# The project's own declaration, cut to what these tests import (pytest from the configured index).
PYPROJECT = """[project]
name = "humanize"
dynamic = ["version"]
requires-python = ">=3.10"
optional-dependencies.tests = ["pytest"]
"""
ENV = {
    "PATH": "/usr/bin:/bin",
    "GIT_AUTHOR_NAME": "hybrid",
    "GIT_AUTHOR_EMAIL": "test@hybrid.invalid",
    "GIT_COMMITTER_NAME": "hybrid",
    "GIT_COMMITTER_EMAIL": "test@hybrid.invalid",
}


def _git(repo: Path, *args: str, stdin: str | None = None, date: str | None = None) -> str:
    env = ENV | ({"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date} if date else {})
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, input=stdin, text=True, capture_output=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The parent commit (fix and test change reversed), then the real commit on top."""
    root = tmp_path_factory.mktemp("validate") / "humanize"
    shutil.copytree(DATA / "before", root)
    (root / "pyproject.toml").write_text(PYPROJECT)
    _git(root, "init", "-q")
    _git(root, "apply", "-R", stdin=(DATA / "tests.diff").read_text())
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "parent")
    _git(root, "apply", stdin=(DATA / "tests.diff").read_text())
    _git(root, "apply", stdin=(DATA / "fix.diff").read_text())
    _git(root, "commit", "-qam", "Fix naturalsize() rounding rollover at unit boundaries (#329)")
    return root


def _spec() -> SandboxSpec:
    return SandboxSpec.model_validate(
        {"tier": "docker", "budget": {"wall_seconds": 300, "memory": "1G", "pids": 256}}
    )


def _workstations() -> list[str]:
    rows = client().api.containers(
        all=True,
        filters={
            "label": [
                f"{LABEL_MANAGED}=1",
                f"{LABEL_KIND}=workstation",
                f"{LABEL_OWNER}={_owner()}",
            ]
        },
    )
    return [row["Names"][0] for row in rows]


def test_real_fix_commit_validates(engine, repo: Path) -> None:
    before = _workstations()
    result = validate(repo, "HEAD", spec=_spec(), backend=engine)
    assert result.validated, (result.failure, result.reason, [r.tail[-800:] for r in result.runs])
    assert result.tests == ["tests/test_filesize.py"]
    assert result.source == ["src/humanize/filesize.py"]
    # The six new cases go from failing to passing, and only they.
    assert len(result.fail_to_pass) == 6
    assert all("test_naturalsize" in t for t in result.fail_to_pass)
    assert any("1.0 MB" in t for t in result.fail_to_pass)
    states = {run.state: run for run in result.runs}
    assert states["tests"].exit_code != 0 and states["fixed"].exit_code == 0
    assert all(states["tests"].outcomes[t] == "failed" for t in result.fail_to_pass)
    # Every test that passed at the parent still passes, and there are many.
    assert len(result.pass_to_pass) >= 50 and result.broken == []
    assert _workstations() == before


def test_a_project_with_nothing_to_install_runs_on_the_images_python(
    engine, repo: Path, tmp_path: Path
) -> None:
    """Nothing declared to install (pyparsing names its test runner only for a tox factor):
    the workstation still has `python` and the project's source on its path, and the image's
    own pytest runs the tests."""
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(repo), str(clone))
    _git(clone, "checkout", "-q", "HEAD~1")
    (clone / "pyproject.toml").write_text('[project]\nname = "humanize"\nversion = "4.9"\n')
    _git(clone, "commit", "-qam", "parent declaring nothing to install")
    _git(clone, "cherry-pick", _git(repo, "rev-parse", "HEAD").strip())
    result = validate(clone, "HEAD", spec=_spec(), backend=engine)
    assert result.validated, (result.failure, result.reason, [r.tail[-800:] for r in result.runs])
    assert all(run.command.startswith("python3 ") for run in result.runs)


CLI_TEST = """import subprocess


def test_the_command_rounds_into_the_next_unit(request):
    request.config.cache.set("hsize/last", 999999)  # needs pytest's cache provider
    done = subprocess.run(["hsize", "999999"], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "1.0 MB"
"""


def test_console_scripts_and_pytest_cache_work_as_installed(
    engine, repo: Path, tmp_path: Path
) -> None:
    """The project's console scripts are commands, as after `pip install -e .` (python-dotenv's
    tests run `dotenv`), and pytest keeps its cache provider (werkzeug's pytest-xprocess needs
    `config.cache`), outside the workspace."""
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(repo), str(clone))
    _git(clone, "checkout", "-q", "HEAD~1")
    (clone / "pyproject.toml").write_text(
        PYPROJECT + '[project.scripts]\nhsize = "humanize.size_cli:main"\n'
    )
    (clone / "src" / "humanize" / "size_cli.py").write_text(
        "import sys\n\nfrom humanize import naturalsize\n\n\n"
        "def main():\n    print(naturalsize(int(sys.argv[1])))\n"
    )
    _git(clone, "add", "-A")
    _git(clone, "commit", "-qm", "A command")
    _git(clone, "apply", stdin=(DATA / "fix.diff").read_text())
    (clone / "tests" / "test_size_cli.py").write_text(CLI_TEST)
    _git(clone, "add", "-A")
    _git(clone, "commit", "-qm", "Fix the command's rounding at unit boundaries")
    result = validate(clone, "HEAD", spec=_spec(), backend=engine)
    assert result.validated, (result.failure, result.reason, [r.tail[-800:] for r in result.runs])
    assert [t.rpartition("::")[2] for t in result.fail_to_pass] == [
        "test_the_command_rounds_into_the_next_unit"
    ]


def _validate_on_top(
    engine: Backend, repo: Path, *, parent_tests: str = "", fix_tests: str = "\n# a comment\n"
) -> Validation:
    """Validate a commit on top of the fixture's that touches the source and appends
    ``fix_tests`` to the test file, after one that appends ``parent_tests`` (when given); the
    repository is put back afterwards."""
    test = repo / "tests" / "test_filesize.py"
    commits = 1
    if parent_tests:
        test.write_text(test.read_text() + parent_tests)
        _git(repo, "commit", "-qam", "The parent's tests")
        commits = 2
    target = repo / "src" / "humanize" / "filesize.py"
    target.write_text(target.read_text() + "\n# a comment\n")
    test.write_text(test.read_text() + fix_tests)
    _git(repo, "commit", "-qam", "Touch the source and the tests")
    try:
        return validate(repo, "HEAD", spec=_spec(), backend=engine)
    finally:
        _git(repo, "reset", "-q", "--hard", f"HEAD~{commits}")


@pytest.mark.parametrize("broken", [False, True], ids=["all-pass", "one-fails-everywhere"])
def test_a_commit_whose_tests_already_pass_does_not_validate(
    engine, repo: Path, broken: bool
) -> None:
    """A source change the tests never noticed: no FAIL_TO_PASS, so it must not validate; and
    it says so even when a test fails in every state (one that needs the network)."""
    failing = "\n\ndef test_needs_the_network():\n    assert False\n"
    result = _validate_on_top(engine, repo, parent_tests=failing if broken else "")
    assert not result.validated
    assert result.fail_to_pass == []
    assert result.failure == "passes_at_parent"
    assert "already pass" in result.reason


def test_new_tests_that_skip_here_say_so(engine, repo: Path) -> None:
    """structlog 1f7765e764: the fix's test runs only without an optional dependency, so it
    skips in every state; the reason says that, not only that the tests already pass."""
    skipped = (
        "\n\n@pytest.mark.skipif(True, reason='Needs missing Rich.')\n"
        "def test_without_rich():\n    assert False\n"
    )
    result = _validate_on_top(engine, repo, fix_tests=skipped)
    assert not result.validated and result.failure == "passes_at_parent"
    assert result.reason.startswith("the commit's new tests are skipped here (1)"), result.reason


def test_test_ids_that_change_between_runs_are_not_flaky_or_fixed(engine, repo: Path) -> None:
    """A test parametrised by the time has a new id in every run (marshmallow's datetime
    cases): the commit's tests pass at its parent, which is what it must say; not that a
    second run disagreed, and not that the new ids went from failing to passing."""
    stamped = (
        "\n\nimport time\n\n\n@pytest.mark.parametrize('stamp', [time.time_ns()])\n"
        "def test_stamped(stamp):\n    assert stamp\n"
    )
    result = _validate_on_top(engine, repo, fix_tests=stamped)
    assert not result.validated
    assert result.fail_to_pass == []
    assert result.failure == "passes_at_parent", result.reason
    assert "already pass" in result.reason


def test_tests_that_never_run_do_not_read_as_passing(engine, repo: Path) -> None:
    """A test file that errors at collection in every state (a later pytest refusing an older
    project's tests) says so, instead of "the tests already pass"."""
    result = _validate_on_top(engine, repo, parent_tests="\nraise RuntimeError('cannot collect')\n")
    assert not result.validated
    assert result.failure == "other"
    assert result.reason.startswith("no test passes after the fix"), result.reason
    assert "cannot collect" in result.reason
    # Tried again with the packages of the commit's day, which could not help either.
    assert result.exclude_newer is not None


def test_tests_todays_pytest_refuses_validate_with_the_tools_of_their_day(
    engine, repo: Path
) -> None:
    """dateutil 5cf3e3cbfa: today's pytest turns an iterator given to parametrize into a
    deprecation, the project's ``filterwarnings`` makes that an error, and no test collects in
    any state. Resolved as of the commit's date (pytest 6.2), the same commit validates."""
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text()
        + '\n[tool.pytest.ini_options]\nfilterwarnings = ["error::DeprecationWarning"]\n'
    )
    _git(repo, "commit", "-qam", "Warnings are errors", date="2021-05-01T12:00:00+00:00")
    source = repo / "src" / "humanize" / "filesize.py"
    source.write_text(source.read_text() + "\n\ndef twice(n):\n    return 2 * n\n")
    test = repo / "tests" / "test_filesize.py"
    test.write_text(
        test.read_text()
        + "\n\n@pytest.mark.parametrize('n', iter([2]))\ndef test_twice(n):\n"
        + "    from humanize.filesize import twice\n\n    assert twice(n) == 4\n"
    )
    _git(repo, "commit", "-qam", "Fix twice", date="2021-06-01T12:00:00+00:00")
    try:
        result = validate(repo, "HEAD", spec=_spec(), backend=engine)
    finally:
        _git(repo, "reset", "-q", "--hard", "HEAD~2")
    assert result.validated, (result.failure, result.reason, [r.tail[-800:] for r in result.runs])
    assert result.exclude_newer == datetime(2021, 6, 1, 12, tzinfo=UTC)
    assert any("test_twice" in t for t in result.fail_to_pass)


def test_a_test_that_hangs_before_the_fix_fails_alone(engine, repo, monkeypatch) -> None:
    """The fix's new test hangs at the parent (a wait that never ends): it fails at the per-test
    limit while the run goes on, so the commit validates instead of the run timing out."""
    monkeypatch.setattr(validate_module, "PER_TEST_SECONDS", 3.0)
    wait = repo / "src" / "humanize" / "_wait.py"
    wait.write_text("import time\n\n\ndef ready():\n    while True:\n        time.sleep(0.1)\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "A wait")
    wait.write_text("def ready():\n    return True\n")
    (repo / "tests" / "test_wait.py").write_text(
        "from humanize._wait import ready\n\n\ndef test_ready():\n    assert ready()\n"
    )
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "Fix a wait that never ends")
    try:
        result = validate(repo, "HEAD", spec=_spec(), backend=engine, timeout=60)
    finally:
        _git(repo, "reset", "-q", "--hard", "HEAD~2")
    assert result.validated, (result.failure, result.reason, [r.tail[-800:] for r in result.runs])
    assert result.fail_to_pass == ["tests/test_wait.py::tests.test_wait::test_ready"]
    tests = next(run for run in result.runs if run.state == "tests")
    assert tests.termination == "nonzero_exit" and tests.seconds < 60
    assert "hybrid validate's limit per test" in tests.tail


def test_commits_that_are_not_fixes_with_tests_are_bad_input(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="not a git repository"):
        change_of(tmp_path, "HEAD")
    with pytest.raises(InvalidInput, match="no commit"):
        change_of(repo, "no-such-commit")
    with pytest.raises(InvalidInput, match="exactly one parent"):
        change_of(repo, _git(repo, "rev-list", "--max-parents=0", "HEAD").strip())
    (repo / "README.md").write_text("docs\n")
    _git(repo, "add", "README.md")
    _git(repo, "commit", "-qm", "docs only")
    try:
        with pytest.raises(InvalidInput, match="must change test files and source code"):
            change_of(repo, "HEAD")
    finally:
        _git(repo, "reset", "-q", "--hard", "HEAD~1")


def test_a_declaration_pip_cannot_read_is_a_dependency_failure(repo: Path, tmp_path: Path) -> None:
    # The project's own file is at fault, not the caller: classified, not raised as bad input.
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(repo), str(clone))
    _git(clone, "checkout", "-q", "HEAD~1")
    (clone / "tox.ini").write_text("[testenv]\ndeps = pytest >= = 8\n")
    _git(clone, "add", "tox.ini")
    _git(clone, "commit", "-qm", "parent with a broken tox.ini")
    _git(clone, "cherry-pick", _git(repo, "rev-parse", "HEAD").strip())
    result = validate(clone, "HEAD", spec=_spec())
    assert not result.validated
    assert result.failure == "dependency"
    assert result.reason.startswith("tox.ini: not a requirement")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("tests/test_x.py", True),
        ("src/pkg/test_x.py", True),
        ("pkg/tests/helpers.py", True),
        ("tests/fixtures/data.json", False),
        ("lib/command.js", False),
        ("tests/command.help.test.js", True),
        ("src/pkg/testing_utils.txt", False),
        ("src/pkg/core.py", False),
    ],
)
def test_which_files_are_tests(path: str, expected: bool) -> None:
    assert is_test(path) is expected


def test_jest_report_gives_test_ids() -> None:
    """jest --json's report (the shape jest 29 writes): one id per assertion, a file that did not
    run is an error, pending tests are skipped."""
    from hybrid.validate import _jest

    report = {
        "testResults": [
            {
                "name": "/workspace/tests/a.test.js",
                "status": "failed",
                "assertionResults": [
                    {"fullName": "parse handles -1", "status": "failed"},
                    {"fullName": "parse handles 1", "status": "passed"},
                    {"fullName": "later", "status": "pending"},
                ],
            },
            {"name": "/workspace/tests/b.test.js", "status": "failed", "assertionResults": []},
        ]
    }
    import json

    assert _jest(json.dumps(report).encode(), "/workspace") == {
        "tests/a.test.js::parse handles -1": "failed",
        "tests/a.test.js::parse handles 1": "passed",
        "tests/a.test.js::later": "skipped",
        "tests/b.test.js::": "error",
    }
