"""Real fix-commit validation: does a commit's test change catch the bug its source change fixes?

For a commit that changes both tests and source, in a workstation at the commit's parent with
the project's dependencies admitted and installed offline (``hybrid.deps``), the changed test
files run three times: as they were (``before``), with the commit's test changes (``tests``:
the new tests must fail) and with its source changes too (``fixed``: they must pass). A commit
validates when at least one test goes from failing to passing (FAIL_TO_PASS) and every test
that passed before still passes (PASS_TO_PASS). A commit that does not validate gets one
failure class: dependency (not installable, or its test runner cannot run on the image's
Python), interpreter (its tests use what the image's Python removed), service (needs postgres,
redis, ...), network, flaky (a second run of the same state disagrees) or other. The first two
are tried again on the other Python images the engine holds (older first).

Files are read from the repository's git objects (``git archive``, ``git show``), never from a
work tree; nothing of the project runs on the host.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shutil
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from hybrid import git
from hybrid.agent.project import project_workstation, write_generated
from hybrid.deps.detect import tag_release
from hybrid.errors import (
    DependencyError,
    HybridError,
    InvalidDeclaration,
    InvalidInput,
    PolicyViolation,
)
from hybrid.paths import display

if TYPE_CHECKING:
    from hybrid.policy import SandboxSpec
    from hybrid.workstation.base import Backend, Workstation

State = Literal["before", "tests", "fixed"]
Failure = Literal[
    "dependency", "interpreter", "service", "network", "flaky", "passes_at_parent", "other"
]
FAILURES: tuple[Failure, ...] = (
    "dependency",
    "interpreter",  # the tests use what the image's Python removed (collections.Mapping)
    "service",
    "network",
    "flaky",
    "passes_at_parent",  # the commit's own tests do not catch its bug: the commit's, not ours
    "other",
)

_TEST_DIRS = {"test", "tests", "testing", "__tests__", "spec", "specs"}
_TEST_NAME = re.compile(
    r"^(test_.*\.py|.*_tests?\.py|conftest\.py|.*\.(test|spec)\.[cm]?[jt]sx?)$", re.IGNORECASE
)
_PY_TEST = re.compile(r"^(test_.*|.*_test)\.py$")
_CODE = {".py", ".pyi", ".js", ".cjs", ".mjs", ".ts", ".cts", ".mts", ".jsx", ".tsx"}
# In the workspace: the engine copies files out of the container's root and volumes, not tmpfs.
# (The environment is left as it is: NO_COLOR and friends change what some tests assert.)
_REPORT = ".hybrid-validate-report"
# One hung test (a fix's test often hangs before the fix: a read that never ends) must fail
# alone, not spend the whole run's time and leave every outcome unknown. pytest gets this
# plugin, written to /tmp for each run: each test phase has PER_TEST_SECONDS, then an
# exception pytest reports as that test's failure (re-raised every few seconds, in case the
# code swallows it); the run's own timeout stays the backstop.
PER_TEST_SECONDS = 60.0
_LIMIT_DIR = "/tmp/.hybrid-validate"
_LIMIT_PLUGIN = """
import signal

import pytest

SECONDS = @SECONDS@


class TestTimedOut(BaseException):
    pass


def _expired(signum, frame):
    raise TestTimedOut("ran over %gs, hybrid validate's limit per test" % SECONDS)


def _limited():
    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, SECONDS, 5.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _limited()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _limited()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _limited()
"""
# Standard-library modules a Python release removed (3.12: PEP 632, imp, asyncore; 3.13: PEP
# 594), and modules that lost names (collections.Mapping in 3.10, inspect.getargspec in 3.11).
_REMOVED_MODULES = (
    "imp", "distutils", "asynchat", "asyncore", "smtpd", "aifc", "audioop", "cgi", "cgitb",
    "chunk", "crypt", "imghdr", "mailcap", "msilib", "nis", "nntplib", "ossaudiodev", "pipes",
    "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib", "lib2to3",
)  # fmt: skip
_CHANGED_MODULES = (
    "collections", "inspect", "asyncio", "typing", "configparser", "pkgutil", "ssl", "locale",
    "gettext", "base64", "unittest", "array", "binascii", "platform", "fractions", "math",
    "html.parser", "xml.etree.ElementTree", "importlib", "importlib.resources",
)  # fmt: skip
_SIGNS: list[tuple[Failure, re.Pattern[str]]] = [
    (
        "network",
        re.compile(
            r"Temporary failure in name resolution|Name or service not known|Network is "
            r"unreachable|getaddrinfo|ENOTFOUND|EAI_AGAIN|nodename nor servname|"
            r"Failed to establish a new connection|NewConnectionError",
        ),
    ),
    (
        "service",
        re.compile(
            r"(Connection refused|ECONNREFUSED).*(5432|6379|3306|27017|11211)|"
            r"could not connect to server|redis\.exceptions\.ConnectionError|"
            r"psycopg2?\.OperationalError|pymongo\.errors\.ServerSelectionTimeoutError",
        ),
    ),
    (
        "interpreter",
        re.compile(
            rf"No module named '({'|'.join(_REMOVED_MODULES)})[.']|"
            rf"cannot import name '\w+' from '({'|'.join(_CHANGED_MODULES)})'|"
            rf"module '({'|'.join(_CHANGED_MODULES)})' has no attribute|"
            r"object has no attribute '(assertEquals|assertNotEquals|assertItemsEqual|"
            r"assertRegexpMatches|assertNotRegexpMatches|assertRaisesRegexp|"
            r"assertDictContainsSubset|failUnless\w*|failIf\w*|isAlive|getchildren|getiterator)'"
        ),
    ),
    (
        "dependency",
        re.compile(r"ModuleNotFoundError: No module named|Cannot find module|ERR_MODULE_NOT_FOUND"),
    ),
]
# The test runner itself failing (pytest < 6.2.5 rewriting asserts on Python 3.10+: 'required
# field "lineno" missing from alias'): the error is raised in the runner's own package.
_RUNNER_BROKEN = re.compile(
    r"packages/(_pytest|pluggy|py)/\S+:\d+: in \S+\n(?:[ \t].*\n|\n)*?(E   \S.*)|"
    r'File "[^"]*packages/(_pytest|pluggy|py)/[^"]+", line \d+, in \S+\n(?:[ \t].*\n)*?'
    r"(\w+(?:Error|Exception): .*)|"
    # pytest names its own failure without a traceback when it meets it in a conftest.py
    r'(TypeError: required field "lineno" missing from alias)'
)
RUNNER_BROKEN = "the test runner cannot run on this image's Python"
PYTHON_SUITES = ("bullseye", "bookworm", "trixie", "forky")
"""Debian releases whose images give other Pythons (3.9, 3.11, 3.13, 3.14) to try again on."""


class Change(BaseModel):
    """A commit split into its test files and everything else."""

    commit: str
    parent: str
    subject: str
    date: datetime = Field(description="When the commit was made (its committer date).")
    tests: list[str] = Field(description="Changed test files (paths as of the commit).")
    source: list[str] = Field(description="Every other changed file.")
    deleted: list[str] = Field(default_factory=list, description="Files the commit removes.")


class Run(BaseModel):
    """One run of the test files in one state."""

    state: State
    command: str
    exit_code: int | None
    termination: str = Field("ok", description="How the run ended (ok, nonzero_exit, timeout...).")
    seconds: float
    outcomes: dict[str, str] = Field(
        default_factory=dict, description="test id -> passed | failed | error | skipped."
    )
    tail: str = Field("", description="The last lines of the output.")


class Validation(BaseModel):
    """Whether one fix commit validates, and why not when it does not."""

    repo: str
    commit: str
    parent: str
    subject: str
    tests: list[str]
    source: list[str]
    validated: bool
    failure: Failure | None = None
    reason: str = ""
    fail_to_pass: list[str] = Field(default_factory=list)
    pass_to_pass: list[str] = Field(default_factory=list)
    broken: list[str] = Field(
        default_factory=list, description="PASS_TO_PASS tests that fail after the fix."
    )
    runs: list[Run] = Field(default_factory=list)
    exclude_newer: datetime | None = Field(
        None, description="The dependencies were resolved as of this time (None: today's)."
    )
    image: str | None = Field(None, description="The image it ran on (None: the base image).")
    seconds: dict[str, float] = Field(default_factory=dict)


def is_test(path: str) -> bool:
    """Whether ``path`` is test code (a tests/ directory, test_*.py, *.test.js, conftest.py)."""
    pure = PurePosixPath(path)
    in_test_dir = any(part.lower() in _TEST_DIRS for part in pure.parts[:-1])
    return pure.suffix in _CODE and (in_test_dir or bool(_TEST_NAME.match(pure.name)))


def change_of(repo: Path, commit: str) -> Change:
    """``commit`` of the git repository ``repo`` split into tests and source (InvalidInput)."""
    if not _git(repo, "rev-parse", "--git-dir", check=False):
        raise InvalidInput(f"{display(repo)}: not a git repository")
    found = _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False)
    if not found:
        raise InvalidInput(f"{display(repo)}: no commit {commit!r}")
    sha = found.strip()
    parents = _git(repo, "rev-list", "--parents", "-n", "1", sha).split()[1:]
    if len(parents) != 1:
        raise InvalidInput(f"{sha[:12]}: a fix commit has exactly one parent ({len(parents)})")
    rows = _git(repo, "diff", "--no-renames", "--name-status", "-z", parents[0], sha).split("\0")
    tests: list[str] = []
    source: list[str] = []
    deleted: list[str] = []
    for status, path in zip(rows[::2], rows[1::2], strict=False):
        if status.startswith("D"):
            deleted.append(path)
        (tests if is_test(path) else source).append(path)
    if not tests or not any(PurePosixPath(p).suffix in _CODE for p in source):
        raise InvalidInput(
            f"{sha[:12]}: not a fix commit with tests: it must change test files and source code"
        )
    subject, _, date = _git(repo, "log", "-1", "--format=%s%n%cI", sha).strip().rpartition("\n")
    return Change(
        commit=sha,
        parent=parents[0],
        subject=subject,
        date=datetime.fromisoformat(date),
        tests=tests,
        source=source,
        deleted=deleted,
    )


def validate(
    repo: Path,
    commit: str,
    *,
    spec: SandboxSpec | None = None,
    backend: Backend | None = None,
    image: str | None = None,
    deps: bool = True,
    test_command: str | None = None,
    timeout: float | None = None,
    interpreters: list[str] | None = None,
) -> Validation:
    """Validate ``commit`` of the git repository ``repo`` in a workstation at its parent.

    ``timeout`` caps each test run (seconds; default the spec's wall clock budget).
    ``test_command`` runs with the test files appended (``{files}`` places them); by default
    pytest, or for a Node project jest, mocha, tap or ``node --test`` (from its devDependencies).
    Test ids come from pytest's JUnit report or jest's JSON report; other runners run once per
    test file, whose exit code is its outcome.
    When today's dependencies cannot run the commit's tests at all (nothing resolves, or no
    test passes in any state), it is tried again with them resolved as of the commit's date
    (``DepsPolicy.exclude_newer``); the spec's own ``exclude_newer`` is used as given.
    When the image's Python is what stops them (the test runner its pins name cannot run on it,
    or the tests use what it removed), it is tried again on each image of ``interpreters``
    (default: the images of other Debian releases the engine holds, older Pythons first).
    Bad input (no such commit, not a fix with tests) raises InvalidInput; everything that
    happens inside is in the result.
    """
    from hybrid.policy import DepsPolicy, SandboxSpec, for_workstation
    from hybrid.workstation import backend as backend_of

    repo = Path(repo)
    if not repo.exists():
        raise InvalidInput(f"{display(repo)}: no such repository")
    change = change_of(repo, commit)
    spec = spec or for_workstation(SandboxSpec(tier="docker"))
    backend = backend or backend_of("gvisor" if spec.tier == "gvisor" else "docker")
    run = functools.partial(_attempt, repo, change, backend, deps, test_command, timeout)
    policy = spec.deps or DepsPolicy()

    def on(where: str | None) -> Validation:
        result = run(spec, where)
        # (Older tools cannot bring back what a Python removed.)
        if (
            deps
            and policy.exclude_newer is None
            and _tools_too_new(result)
            and result.failure != "interpreter"
        ):
            # Today's tools refuse the project at this commit (a later pytest turns its tests
            # into collection errors, or nothing resolves): test it with the tools of its day.
            dated = policy.model_copy(update={"exclude_newer": change.date})
            retried = run(spec.model_copy(update={"deps": dated}), where)
            if retried.validated or retried.failure != "dependency":
                result = retried
        return result

    result = on(image)
    if _interpreter_bound(result):
        others = interpreters if interpreters is not None else other_pythons(image)
        for other in others:
            retried = on(other)
            if retried.validated:
                return retried
            if retried.runs and retried.failure not in ("dependency", "interpreter"):
                # Its tests ran there: what they showed (already passing, say) is the verdict
                # to report, not that this Python could not run them.
                result = retried
    return result


def _interpreter_bound(result: Validation) -> bool:
    """Whether the image's Python, not the commit, is what stopped the tests."""
    return not result.validated and (
        result.failure == "interpreter"
        or (result.failure == "dependency" and result.reason.startswith(RUNNER_BROKEN))
    )


def other_pythons(image: str | None) -> list[str]:
    """The images of the other Debian releases the engine holds (``hybrid image bootstrap
    --suite``), older Pythons first, each side nearest first."""
    from hybrid.deps.layers import target
    from hybrid.workstation import images

    current = image or images.BASE_IMAGE
    try:
        mine = _python_of(target(current).python)
    except HybridError:
        return []
    older: list[tuple[tuple[int, ...], str]] = []
    newer: list[tuple[tuple[int, ...], str]] = []
    for suite in PYTHON_SUITES:
        tag = images.profile_tag("python", suite)
        if tag == current:
            continue
        with contextlib.suppress(HybridError):
            if images.get(tag) is None:
                continue
            version = _python_of(target(tag).python)
            if version != mine:
                (older if version < mine else newer).append((version, tag))
    return [t for _, t in sorted(older, reverse=True)] + [t for _, t in sorted(newer)]


def _python_of(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def _tools_too_new(result: Validation) -> bool:
    """Whether a miss may be today's dependencies being too new for the commit."""
    return result.failure == "dependency" or result.reason.startswith("no test passes")


def _attempt(
    repo: Path,
    change: Change,
    backend: Backend,
    deps: bool,
    test_command: str | None,
    timeout: float | None,
    spec: SandboxSpec,
    image: str | None,
) -> Validation:
    result = Validation(
        repo=str(repo),
        commit=change.commit,
        parent=change.parent,
        subject=change.subject,
        tests=change.tests,
        source=change.source,
        validated=False,
        exclude_newer=spec.deps.exclude_newer if spec.deps else None,
        image=image,
    )
    with tempfile.TemporaryDirectory(prefix="hybrid-validate-") as work:
        checkout = Path(work) / "repo"
        export(repo, change.parent, checkout)
        mark = time.monotonic()
        try:
            ws = project_workstation(backend, checkout, spec, image=image, deps=deps)
        except (DependencyError, PolicyViolation, InvalidDeclaration) as exc:
            result.failure, result.reason = "dependency", str(exc).splitlines()[0][:500]
            return result
        result.seconds["setup"] = time.monotonic() - mark
        with ws:
            try:
                _validate_in(
                    ws,
                    repo,
                    change,
                    checkout,
                    _Runner.for_checkout(checkout, test_command, timeout),
                    result,
                )
            finally:
                ws.remove()
    return result


def _validate_in(
    ws: Workstation,
    repo: Path,
    change: Change,
    checkout: Path,
    runner: _Runner,
    result: Validation,
) -> None:
    before_tests = [p for p in change.tests if (checkout / p).is_file() and runner.runs(p)]
    after_tests = [p for p in change.tests if p not in change.deleted and runner.runs(p)]
    if not after_tests:
        result.failure, result.reason = "other", "the commit changes no runnable test file"
        return
    mark = time.monotonic()
    before = runner.run(ws, "before", before_tests) if before_tests else None
    _apply(ws, repo, change, [p for p in change.tests])
    tests = runner.run(ws, "tests", after_tests)
    _apply(ws, repo, change, change.source)
    fixed = runner.run(ws, "fixed", after_tests)
    result.runs = [r for r in (before, tests, fixed) if r is not None]
    _judge(result, before, tests, fixed)
    if not result.validated:
        # Run the state that decided once more: a different answer is a flaky test.
        if _already_pass(result, before, tests):
            _apply(ws, repo, change, change.source, parent=True)
            decided, rerun = tests, runner.run(ws, "tests", after_tests)
        else:
            decided, rerun = fixed, runner.run(ws, "fixed", after_tests)
        result.runs.append(rerun)
        broken = _runner_broken(result.runs)
        if broken:
            result.failure, result.reason = "dependency", f"{RUNNER_BROKEN}: {broken}"
        elif decided.outcomes and not _agree(rerun, decided):
            result.failure, result.reason = "flaky", f"{result.reason}; a second run disagreed"
        else:
            result.failure = _classify(result, before, fixed) or result.failure or "other"
    result.seconds["tests"] = time.monotonic() - mark


def _judge(result: Validation, before: Run | None, tests: Run, fixed: Run) -> None:
    passed_before = {t for t, o in (before.outcomes if before else {}).items() if o == "passed"}
    # A test missing from the run before the fix failed there (its file did not collect),
    # unless its file ran cleanly: then it is an id that changes between runs (parametrised
    # by the current time), not a test the fix made pass.
    clean = {_file(t) for t in tests.outcomes} - {_file(t) for t in _failed(tests)}
    result.fail_to_pass = sorted(
        t
        for t, o in fixed.outcomes.items()
        if o == "passed"
        and (
            tests.outcomes.get(t) in ("failed", "error")
            or (t not in tests.outcomes and _file(t) not in clean)
        )
    )
    result.pass_to_pass = sorted(t for t in passed_before if t in fixed.outcomes)
    result.broken = sorted(t for t in result.pass_to_pass if fixed.outcomes.get(t) != "passed")
    if "passed" not in fixed.outcomes.values():
        # Nothing ran (a collection error in every state, such as a later pytest refusing an
        # older project's tests), which is not "the tests already pass".
        result.reason = f"no test passes after the fix: {fixed.tail[-300:]}"
    elif tests.termination == "timeout" and not tests.outcomes:
        result.reason = "the commit's tests ran out of time before its source change"
    elif _already_pass(result, before, tests):
        result.failure = "passes_at_parent"
        added = [t for t in fixed.outcomes if t not in (before.outcomes if before else {})]
        if added and all(fixed.outcomes[t] == "skipped" for t in added):
            # A test for another environment (structlog's "without Rich" case): the verdict is
            # the same, but the reason says what would make it run.
            result.reason = (
                f"the commit's new tests are skipped here ({len(added)}): they are for another "
                "environment (an optional dependency absent, another platform)"
            )
        else:
            result.reason = "the commit's tests already pass before its source change"
    elif not result.fail_to_pass:
        failing = sorted(t for t, o in fixed.outcomes.items() if o in ("failed", "error"))
        result.reason = f"no test goes from failing to passing ({len(failing)} still fail)"
    elif result.broken:
        result.reason = f"{len(result.broken)} test(s) that passed before fail after the fix"
    else:
        result.validated = True


def _already_pass(result: Validation, before: Run | None, tests: Run) -> bool:
    """Whether the tests, changed by the commit, pass without its source change: nothing fails
    but what already failed at the parent (a test that needs the network fails in every state)
    and nothing goes from failing to passing."""
    return tests.exit_code == 0 or (
        not result.fail_to_pass and bool(tests.outcomes) and _failed(tests) <= _failed(before)
    )


def _failed(run: Run | None) -> set[str]:
    return {t for t, o in (run.outcomes if run else {}).items() if o in ("failed", "error")}


def _file(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def _agree(one: Run, other: Run) -> bool:
    """Whether two runs of one state agree: the same outcome for every test both ran, and the
    same outcomes per file for tests only one ran (ids carrying a time or a random value)."""
    common = one.outcomes.keys() & other.outcomes.keys()
    if any(one.outcomes[t] != other.outcomes[t] for t in common):
        return False

    def rest(run: Run) -> Counter[tuple[str, str]]:
        return Counter((_file(t), o) for t, o in run.outcomes.items() if t not in common)

    return rest(one) == rest(other)


def python_bound(output: str) -> bool:
    """Whether a test command's output shows the image's Python stopping it: the runner failing
    in its own code (no test passed or failed), or a test using what the Python removed."""
    if re.search(r"\b\d+ (passed|failed)\b", output):
        return False
    interpreter = next(pattern for failure, pattern in _SIGNS if failure == "interpreter")
    return bool(_RUNNER_BROKEN.search(output) or interpreter.search(output))


def _runner_broken(runs: list[Run]) -> str | None:
    """The error, when no test ran to a pass or a failure in any run and the runner's own code
    raised it: the runner the project pins does not work on this Python."""
    if any(o in ("passed", "failed") for run in runs for o in run.outcomes.values()):
        return None
    for run in runs:
        found = _RUNNER_BROKEN.search(run.tail)
        if found:
            error = found.group(2) or found.group(4) or found.group(5) or ""
            return error.removeprefix("E").strip()[:300]
    return None


def _classify(result: Validation, before: Run | None, fixed: Run) -> Failure | None:
    """The environment's signs in the output, when failures that decided the result show them.

    Tests that already failed at the parent (a connect timeout with the network off) fail after
    the fix too; they decide nothing, so their network errors in the output say nothing either.
    """
    decisive = _failed(fixed) - _failed(before)
    if fixed.outcomes and not decisive and not result.broken:
        return None
    text = "\n".join(r.tail for r in result.runs)
    for failure, pattern in _SIGNS:
        if pattern.search(text):
            return failure
    return None


class _Runner:
    """How the project's tests run: with a per-test report (pytest's JUnit XML, jest's JSON), or
    once per test file, the file's outcome being the command's exit code."""

    def __init__(self, command: str, suffixes: tuple[str, ...]) -> None:
        self.report: Literal["junit", "jest"] | None = None
        words = command.split()
        if "pytest" in words and "--junitxml" not in command:
            self.report = "junit"
            command += f" -o junit_family=xunit1 --junitxml={{workspace}}/{_REPORT}"
            command += " -p hybrid_test_limit"
        elif "jest" in words and "--json" not in words:
            self.report = "jest"
            command += f" --json --outputFile={{workspace}}/{_REPORT}"
        self.command = command
        self.suffixes = suffixes
        self.timeout: float | None = None

    @classmethod
    def for_checkout(cls, checkout: Path, command: str | None, timeout: float | None) -> _Runner:
        node = (checkout / "package.json").is_file() and not any(
            (checkout / f).is_file() for f in ("pyproject.toml", "setup.py", "setup.cfg")
        )
        if node:
            runner = cls(command or _node_command(checkout), (".js", ".cjs", ".mjs", ".ts"))
        else:
            # python3: a project with nothing to install has no venv, and the image has no `python`.
            # The cache goes to /tmp, emptied before each run: a plugin may need it (werkzeug's
            # pytest-xprocess), and it never reaches the workspace's diff or the next state.
            default = "python3 -m pytest -o cache_dir=/tmp/.pytest_cache -q --color=no"
            runner = cls(command or default, (".py",))
        runner.timeout = timeout
        return runner

    def runs(self, path: str) -> bool:
        pure = PurePosixPath(path)
        if pure.suffix not in self.suffixes or pure.name == "conftest.py":
            return False
        if self.report == "junit":
            return bool(_PY_TEST.match(pure.name))
        return bool(_TEST_NAME.match(pure.name)) or any(p in _TEST_DIRS for p in pure.parts)

    def run(self, ws: Workstation, state: State, files: list[str]) -> Run:
        if self.report:
            return self._once(ws, state, files)
        mark = time.monotonic()
        outcomes: dict[str, str] = {}
        tails: list[str] = []
        code: int | None = 0
        for path in files:
            one = self._once(ws, state, [path])
            outcomes[path] = "passed" if one.exit_code == 0 else "failed"
            tails.append(one.tail)
            code = one.exit_code if one.exit_code != 0 else code
        return Run(
            state=state,
            command=self.command,
            exit_code=code,
            seconds=time.monotonic() - mark,
            outcomes=outcomes,
            tail="\n".join(tails)[-4000:],
        )

    def _once(self, ws: Workstation, state: State, files: list[str]) -> Run:
        quoted = " ".join(_quote(f) for f in files)
        command = (
            self.command.replace("{files}", quoted)
            if "{files}" in self.command
            else f"{self.command} {quoted}"
        )
        command = command.replace("{workspace}", ws.spec.workspace)
        report = f"{ws.spec.workspace}/{_REPORT}"
        mark = time.monotonic()
        # Each run starts from an empty /tmp: a file an earlier state left there (requests
        # extracts a zipped test file to /tmp once and reuses it) must not decide this one.
        fresh = f"rm -rf /tmp/* /tmp/.[!.]* 2>/dev/null; rm -f {report}"
        plugin: list[str] = []
        if self.report == "junit":
            fresh += (
                f'; mkdir -p {_LIMIT_DIR} && printf %s "$1" > {_LIMIT_DIR}/hybrid_test_limit.py'
                f"; export PYTHONPATH={_LIMIT_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"
            )
            plugin = ["sh", _LIMIT_PLUGIN.replace("@SECONDS@", f"{PER_TEST_SECONDS!r}")]
        done = ws.exec(["/bin/sh", "-c", f"{fresh}; {command}", *plugin], timeout=self.timeout)
        seconds = time.monotonic() - mark
        outcomes: dict[str, str] = {}
        if self.report:
            with contextlib.suppress(HybridError, ET.ParseError, ValueError, KeyError, TypeError):
                data = ws.get(report) or b""
                read = _junit if self.report == "junit" else _jest
                outcomes = read(data, ws.spec.workspace)
            ws.exec(["rm", "-f", report])
        tail = (done.stdout[-3000:] + "\n" + done.stderr[-1500:]).strip()
        return Run(
            state=state,
            command=command,
            exit_code=done.exit_code,
            termination=str(done.termination),
            seconds=seconds,
            outcomes=outcomes,
            tail=tail,
        )


def _node_command(checkout: Path) -> str:
    import json

    with contextlib.suppress(OSError, ValueError):
        manifest = json.loads((checkout / "package.json").read_text(encoding="utf-8"))
        dev = {**manifest.get("dependencies", {}), **manifest.get("devDependencies", {})}
        if "jest" in dev:
            return "jest --ci --silent"
        if "mocha" in dev:
            return "mocha"
        if "tap" in dev:
            return "tap --no-coverage"
    return "node --test"


def _jest(report: bytes, workspace: str) -> dict[str, str]:
    import json

    outcomes: dict[str, str] = {}
    status = {"passed": "passed", "failed": "failed", "pending": "skipped", "todo": "skipped"}
    for suite in json.loads(report)["testResults"]:
        path = str(suite["name"]).removeprefix(workspace + "/")
        cases = suite.get("assertionResults") or []
        if not cases:  # the file did not run (a syntax error, a failed require)
            outcomes[f"{path}::"] = "error" if suite.get("status") == "failed" else "skipped"
        for case in cases:
            outcomes[f"{path}::{case['fullName']}"] = status.get(case["status"], "failed")
    return outcomes


def _junit(report: bytes, workspace: str = "") -> dict[str, str]:
    outcomes: dict[str, str] = {}
    for case in ET.fromstring(report).iter("testcase"):
        if not case.get("name"):
            continue  # pytest's INTERNALERROR record, not a test
        where = case.get("file") or case.get("classname") or ""
        test_id = f"{where}::{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                break
        # A parametrised id seen twice (setup and call errors) keeps its worst outcome.
        if outcomes.get(test_id) not in ("failed", "error"):
            outcomes[test_id] = outcome
    return outcomes


def _apply(
    ws: Workstation, repo: Path, change: Change, paths: list[str], *, parent: bool = False
) -> None:
    """Write ``paths`` as of the commit (or its parent) into the workspace; removed files go."""
    rev = change.parent if parent else change.commit
    present = set(_git(repo, "ls-tree", "-r", "--name-only", "-z", rev, "--", *paths).split("\0"))
    gone = [p for p in paths if p not in present]
    keep = [p for p in paths if p in present]
    if keep:
        data = git.run(["archive", "--format=tar", rev, "--", *keep], repo, check=True).stdout
        with tempfile.TemporaryDirectory(prefix="hybrid-validate-") as tmp:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(tmp, filter=_in_tree)
            for top in sorted({PurePosixPath(p).parts[0] for p in keep}):
                ws.put(Path(tmp) / top, top)
    if gone:
        ws.exec(["rm", "-f", "--", *gone])


def _in_tree(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's data filter, except that a member it refuses (a link to an absolute path or
    out of the tree, as a hostile commit can track) is left out instead of ending the run with a
    traceback: nothing hybrid writes or reads on the host follows a link out of a repository."""
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError:
        return None


def export(repo: Path, rev: str, into: Path) -> None:
    """The tree of ``rev`` written to ``into``, plus the version file a build would generate."""
    into.mkdir(parents=True)
    archive = git.run(["archive", "--format=tar", rev], repo, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter=_in_tree)
    # The export has no .git: the release it is at (its latest tag) goes in the PKG-INFO an
    # sdist of it would carry, where dependency detection reads it.
    version = tag_release(repo, rev)
    if version and not (into / "PKG-INFO").exists():
        (into / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nVersion: {version}\n")
    # hatch-vcs and setuptools-scm write a version module at build time; the project is not
    # built (it is put on sys.path as it is), so write what they would.
    write_generated(into, version or "0.0.0")


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _git(repo: Path, *args: str, check: bool = True) -> str:
    if shutil.which("git") is None:
        raise HybridError("git is needed to read the repository's commits")
    done = git.run(args, repo, text=True)
    if done.returncode != 0:
        if not check:
            return ""
        raise InvalidInput(
            f"{display(repo)}: git {args[0]} failed: {done.stderr.strip()[-300:] or 'not a git repository'}"
        )
    return done.stdout


__all__ = [
    "FAILURES",
    "Change",
    "Run",
    "Validation",
    "change_of",
    "export",
    "is_test",
    "other_pythons",
    "python_bound",
    "validate",
]
