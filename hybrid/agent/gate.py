"""The review gate: what a candidate patch must pass before a person looks at it.

The patch is judged by what git writes, before any untrusted code runs: git applies it on the
host into a scratch index (hybrid.agent.applied), and every check reads that result. The touched
paths are in scope (the ``scope`` check on git's own diff of the result: allowed prefixes,
``.env*``, CI workflows, credential files, lockfiles unless allowed; no symlink out of the
repository, no submodule); no credential is added (hybrid.agent.secretscan, on every added line
and every binary byte); no dependency manifest changes unless admitted; neither the task's tests
nor the test machinery change (hybrid.agent.testfiles), unless the task says its tests may
change, and even then the tests that run are the task's. An empty patch, or one that changes
nothing, is blocked. The reviewed diff is that result, fixed before the tests run; the
workstation applies it (the task's tests restored), the gate checks that the tree it tests is
that tree, then runs the task's tests and regressions there. It never merges or pushes: the
disposition is ``ready for human review`` or ``blocked`` with every reason.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, Field

from hybrid.agent.applied import MODE_GITLINK, MODE_LINK, Change
from hybrid.errors import (
    DependencyError,
    InvalidDeclaration,
    InvalidDiff,
    InvalidInput,
    PolicyViolation,
)
from hybrid.paths import display
from hybrid.policy import Budget, SandboxSpec
from hybrid.results import ExecutionResult, Termination

READY = "ready for human review"
BLOCKED = "blocked"
Disposition = Literal["ready for human review", "blocked"]

PATCH_PATH = ".git/hybrid-candidate.patch"
"""Where a patch too large to travel as an argument is copied before ``git apply``."""

ARGUMENT_PATCH_BYTES = 96 * 1024
"""Patches up to this size travel as the apply command's argument (Linux caps one argument at
128 KiB): no copy into the workstation, which costs a helper container (~100 ms)."""
"""Where the patch goes inside the workspace: under .git, which the reviewed diff never shows."""

DEPENDENCY_FILES = re.compile(
    r"(^|/)(requirements[^/]*\.(txt|in)|constraints[^/]*\.txt|pyproject\.toml|setup\.(py|cfg)|"
    r"Pipfile|environment\.ya?ml|package\.json|Cargo\.toml|go\.mod|Gemfile|pom\.xml|"
    r"build\.gradle(\.kts)?|composer\.json|[^/]*\.gemspec)$"
)
"""Manifests that declare dependencies: a change to one goes to dependency admission."""

DEFAULT_SPEC = SandboxSpec(
    tier="docker", budget=Budget(wall_seconds=300, memory=1024**3, pids=256, cpus=1.0)
)

Progress = Callable[[str], None]


class GateCheck(BaseModel):
    """One check of the gate."""

    name: str = Field(description="scope, secrets, dependencies, apply, test or regression.")
    passed: bool
    detail: str = ""
    result: ExecutionResult | None = Field(None, description="The command's run, for test checks.")


class GateReport(BaseModel):
    """The gate's decision and every reason behind it."""

    disposition: Disposition
    reasons: list[str] = Field(default_factory=list, description="Every reason it is blocked.")
    checks: list[GateCheck] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list, description="Paths the patch touches.")
    reviewed_diff: str = Field(
        "", description="git's diff of what the patch writes, fixed before any test ran."
    )

    @property
    def ready(self) -> bool:
        return self.disposition == READY


NOTHING = "the patch changes nothing"


class Judgement(BaseModel):
    """The host-side checks of a patch, on what git writes."""

    checks: list[GateCheck] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list, description="Every path git writes.")
    reviewed_diff: str = Field("", description="git's diff of what the patch writes.")
    tested_diff: str = Field(
        "", description="What the workstation applies: the reviewed diff, the task's tests kept."
    )

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def applies(self) -> bool:
        """There is a tree to test: git applied the patch and it changes more than tests."""
        return bool(self.tested_diff)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="surrogateescape")


def judge(
    patch: str,
    repo: Path,
    *,
    tests: Sequence[str] = (),
    allow: Sequence[str] = (),
    deny: Sequence[str] = (),
    allow_lockfiles: bool = False,
    allow_dependencies: bool = False,
    tests_may_change: bool = False,
) -> Judgement:
    """Scope, secrets, dependencies and test-machinery checks of what git writes for ``patch``
    on ``repo`` (nothing runs in a sandbox). ``tests`` are the task's test paths."""
    from hybrid.agent.applied import host_apply
    from hybrid.agent.testfiles import judged_changes

    if not patch.strip():
        return Judgement(checks=[GateCheck(name="patch", passed=False, detail=NOTHING)])
    try:
        with host_apply(repo, patch) as applied:
            if applied.result == applied.base:
                return Judgement(checks=[GateCheck(name="patch", passed=False, detail=NOTHING)])
            changes = applied.changes
            blobs = applied.contents(o for c in changes for o in (c.old_oid, c.new_oid) if o)
            reviewed = applied.diff()
            touched = judged_changes(changes, tests, lambda oid: blobs.get(oid) if oid else None)
            restored = applied.restoring(p for p, _ in touched) if touched else applied.result
            tested = applied.diff(restored) if restored != applied.base else b""
    except InvalidDiff as exc:
        check = GateCheck(name="apply", passed=False, detail=exc.message)
        return Judgement(checks=[check])
    judgement = Judgement(
        files=sorted({c.path for c in changes}),
        reviewed_diff=_decode(reviewed),
        tested_diff=_decode(tested),
    )
    judgement.checks.append(_scope(reviewed, changes, blobs, allow, deny, allow_lockfiles))
    judgement.checks.append(_secrets(changes, blobs))
    manifests = [c.path for c in changes if DEPENDENCY_FILES.search(c.path)]
    judgement.checks.append(
        GateCheck(
            name="dependencies",
            passed=allow_dependencies or not manifests,
            detail=(
                f"dependency change needs admission: {', '.join(manifests)}"
                if manifests
                else "no dependency manifest changed"
            ),
        )
    )
    listed = "; ".join(f"{path} ({why})" for path, why in touched)
    if not touched:
        detail = "the task's tests and the test machinery are unchanged"
    elif tests_may_change:
        detail = f"restored to the task's version before the tests run: {listed}"
    else:
        detail = f"the patch changes the task's tests or the test machinery: {listed}"
    judgement.checks.append(
        GateCheck(name="tests", passed=tests_may_change or not touched, detail=detail)
    )
    if tests_may_change and not tested:
        judgement.checks.append(
            GateCheck(name="patch", passed=False, detail=f"{NOTHING} but the task's tests")
        )
    return judgement


def _scope(
    reviewed: bytes,
    changes: Sequence[Change],
    blobs: dict[str, bytes],
    allow: Sequence[str],
    deny: Sequence[str],
    allow_lockfiles: bool,
) -> GateCheck:
    from hybrid.checks import scope

    try:
        report = scope(reviewed, allow=allow, deny=deny, allow_lockfiles=allow_lockfiles)
        problems = [f"{v.message} ({v.rule})" for v in report.violations]
        if report.termination is not Termination.OK:  # out of fuel, say: judged nothing
            problems.append(f"the scope check ended early ({report.termination.value})")
    except InvalidDiff as exc:  # git's own diff: only a module limit can refuse it
        problems = [f"the scope check could not read git's diff: {exc.message}"]
    for change in changes:
        if change.new_mode == MODE_GITLINK:
            problems.append(f"{change.path} becomes a submodule (gitlink)")
    links = [c for c in changes if c.new_mode == MODE_LINK and c.new_oid]
    if links:
        from hybrid.workstation.archive import escapes

        for change in links:
            target = blobs.get(change.new_oid or "", b"/").decode("utf-8", "replace")
            if target.startswith("/") or escapes(change.path, target):
                problems.append(
                    f"{change.path} becomes a symlink out of the repository (symlink-escape)"
                )
    paths = {c.path for c in changes}
    return GateCheck(
        name="scope",
        passed=not problems,
        detail="; ".join(problems) or f"{len(paths)} file(s) in scope",
    )


def _secrets(changes: Sequence[Change], blobs: dict[str, bytes]) -> GateCheck:
    from hybrid.agent.secretscan import added_text, scan_text

    found: dict[str, int] = {}
    where: list[str] = []
    for change in changes:
        if not change.new_oid or change.new_oid not in blobs:
            continue
        old = blobs.get(change.old_oid or "")
        counts = scan_text(added_text(old, blobs[change.new_oid]), change.path)
        if counts:
            where.append(change.path)
            for kind, n in counts.items():
                found[kind] = found.get(kind, 0) + n
    listed = ", ".join(f"{kind} x{n}" for kind, n in sorted(found.items()))
    return GateCheck(
        name="secrets",
        passed=not found,
        detail=f"the diff adds secrets: {listed} (in {', '.join(where)})"
        if found
        else "no secret added",
    )


def static_checks(
    patch: str,
    repo: Path,
    **options: Any,
) -> tuple[list[GateCheck], list[str]]:
    """The host-side checks (``judge``) as (checks, files)."""
    judgement = judge(patch, repo, **options)
    return judgement.checks, judgement.files


def run_in(
    ws: Any, patch: str, commands: Sequence[tuple[str, str]], *, verify: bool = False
) -> list[GateCheck]:
    """Apply ``patch`` in workstation ``ws`` and run each (name, shell command) there.

    With ``verify``, nothing runs unless the workstation's tree after the apply is exactly
    ``patch`` over the tree that went in (its diff, read from the host, equals ``patch``).
    """
    data = patch.encode("utf-8", errors="surrogateescape")
    try:
        data.decode("utf-8")
        as_argument = len(data) <= ARGUMENT_PATCH_BYTES and b"\0" not in data
    except UnicodeDecodeError:  # not text the engine's JSON can carry: copy it in
        as_argument = False
    if as_argument:
        # git apply runs as the sandbox's user and refuses paths outside the work tree.
        applied = ws.exec(["sh", "-c", 'printf "%s" "$0" | git apply --whitespace=nowarn -', patch])
    else:
        ws.put(data, PATCH_PATH)
        # One exec applies and removes the patch file (each exec is a round trip to the engine).
        applied = ws.exec(
            [
                "sh",
                "-c",
                'git apply --whitespace=nowarn "$0"; s=$?; rm -f "$0"; exit $s',
                PATCH_PATH,
            ]
        )
    if not applied.ok:
        why = (applied.stderr or applied.stdout).strip().splitlines()
        detail = f"the patch does not apply: {why[0] if why else applied.termination.value}"
        return [GateCheck(name="apply", passed=False, detail=detail, result=applied)]
    checks = [GateCheck(name="apply", passed=True, detail="git apply: clean")]
    if verify:
        if ws.diff() != patch:
            checks.append(
                GateCheck(
                    name="tree",
                    passed=False,
                    detail="the workstation's tree after the apply is not the judged tree "
                    "(nothing was run)",
                )
            )
            return checks
        checks.append(GateCheck(name="tree", passed=True, detail="the judged tree"))
    for name, command in commands:
        result = ws.exec(["sh", "-c", command])
        detail = "passed" if result.ok else _failure(command, result)
        checks.append(GateCheck(name=name, passed=result.ok, detail=detail, result=result))
    return checks


def _failure(command: str, result: ExecutionResult) -> str:
    how = f"exit {result.exit_code}" if result.exit_code is not None else result.termination.value
    text = (result.stdout + "\n" + result.stderr).strip().splitlines()
    failing = [line.strip() for line in text if re.match(r"\s*(FAILED|ERROR)\b", line)]
    summary = "; ".join(failing[:10]) or (text[-1].strip() if text else "")
    return f"`{command}` failed ({how}){': ' + summary if summary else ''}"


def gate(
    patch: str,
    repo: Path,
    *,
    test: str,
    regression: str | None = None,
    related: str | None = None,
    allow: Sequence[str] = (),
    deny: Sequence[str] = (),
    allow_lockfiles: bool = False,
    allow_dependencies: bool = False,
    tests_may_change: bool = False,
    spec: SandboxSpec | None = None,
    image: str | None = None,
    deps: bool | None = None,
    progress: Progress | None = None,
) -> GateReport:
    """Decide whether ``patch`` against ``repo`` is ready for human review; never merges.

    ``related`` is a test runner command (e.g. ``python3 -m pytest -q``) run on the test files
    the context graph relates to the touched files, as a second regression check.
    ``tests_may_change``: the patch may change the task's tests or the test machinery (it is
    not blocked for it), but the tests that run are still the task's.
    The workstation holds the project as ``hybrid validate`` makes it (``hybrid.agent.project``):
    ``deps`` installs its admitted dependencies offline from the cached layer (default: when the
    repository declares any and the tier starts from an image); dependencies that cannot be
    admitted or installed block, with the reason.
    """
    from hybrid.agent.testfiles import named_tests

    say = progress or (lambda message: None)
    repo = Path(repo)
    if not repo.is_dir():
        raise InvalidInput(f"{display(repo)}: not a directory (--repo names the repository)")
    if not test.strip():
        raise InvalidInput("the gate needs a test command (--test)")
    say("judging what git writes: scope, secrets, dependencies, tests")
    commands = [("test", test)] + ([("regression", regression)] if regression else [])
    named = named_tests([c for _, c in commands], repo)
    options: dict[str, Any] = {
        "allow": allow,
        "deny": deny,
        "allow_lockfiles": allow_lockfiles,
        "allow_dependencies": allow_dependencies,
        "tests_may_change": tests_may_change,
    }
    judgement = judge(patch, repo, tests=named, **options)
    checks = list(judgement.checks)
    tests: list[str] = []
    if related and judgement.files:
        tests = related_tests(repo, judgement.files)
        if set(tests) - set(named):  # the related tests judge too: they are the task's
            named = sorted({*named, *tests})
            judgement = judge(patch, repo, tests=named, **options)
            checks = list(judgement.checks)
        if tests:
            say(f"related tests: {', '.join(tests)}")
            commands.append(
                ("related tests", f"{related} {' '.join(shlex.quote(t) for t in tests)}")
            )
        else:
            checks.append(GateCheck(name="related tests", passed=True, detail="none found"))
    if judgement.applies:
        spec = spec or DEFAULT_SPEC
        static = checks
        # The image's Python can be what stops the tests (the runner the project pins does not
        # run on it, or they use what it removed): as validate does, the other Pythons the
        # engine holds are tried, unless the caller named the image.
        for where in [image, *([] if image else _other_pythons())]:
            say("workstation: installing the dependencies, copying the repository in")
            try:
                made = create_workstation(repo, spec, where, deps)
            except (DependencyError, PolicyViolation, InvalidDeclaration) as exc:
                detail = (
                    f"the project's dependencies cannot be installed: {str(exc).splitlines()[0]}"
                )
                checks = [*static, GateCheck(name="environment", passed=False, detail=detail)]
                break
            with made as ws:
                say("applying the judged diff and running the tests")
                checks = static + run_in(ws, judgement.tested_diff, commands, verify=True)
            if not _python_bound(checks):
                break
        for check in checks:
            if check.name == "related tests" and check.result is not None:
                check.detail += f" ({', '.join(tests)})"
    reasons = [c.detail or f"{c.name} failed" for c in checks if not c.passed]
    return GateReport(
        disposition=BLOCKED if reasons else READY,
        reasons=reasons,
        checks=checks,
        files=judgement.files,
        reviewed_diff=judgement.reviewed_diff,
    )


def _other_pythons() -> list[str]:
    from hybrid.validate import other_pythons

    return other_pythons(None)


def _python_bound(checks: list[GateCheck]) -> bool:
    """Whether a test command failed because of the image's Python, not the patch."""
    from hybrid.validate import python_bound

    return any(
        c.result is not None and not c.passed and python_bound(c.result.stdout + c.result.stderr)
        for c in checks
    )


def create_workstation(
    repo: Path, spec: SandboxSpec, image: str | None = None, deps: bool | None = None
) -> Any:
    """The workstation the gate tests in: a fresh copy of ``repo`` with the project as
    validation makes it (its dependencies, generated files); a context manager."""
    from hybrid.agent.project import DEPS_TIERS, declares_dependencies, project_workstation
    from hybrid.workstation import backend

    if deps is None:
        deps = spec.tier in DEPS_TIERS and declares_dependencies(repo)
    elif deps and spec.tier not in DEPS_TIERS:
        raise InvalidInput(
            f"--deps needs a tier that starts from an image ({', '.join(DEPS_TIERS)})"
        )
    return project_workstation(backend(spec.tier), repo, spec, image=image, deps=deps)


def related_tests(repo: Path, files: Sequence[str]) -> list[str]:
    """Test files the context graph ties to ``files``: they import one, or are named after one
    (``test_<stem>``, ``<stem>_test``), and the touched test files themselves."""
    from hybrid.context.graph import importers
    from hybrid.context.repomap import load_graph
    from hybrid.context.resolve import is_test_path

    graph = load_graph(repo)
    paths: list[str] = graph.paths
    index = {p: i for i, p in enumerate(paths)}
    reverse = importers(graph)
    found: set[str] = {f for f in files if f in index and is_test_path(f)}
    stems = {PurePosixPath(f).stem for f in files}
    names = {n for s in stems for n in (f"test_{s}", f"{s}_test")}
    for f in files:
        if f in index:
            found.update(paths[i] for i in reverse[index[f]] if graph.tests[i])
    found.update(
        p for i, p in enumerate(paths) if graph.tests[i] and PurePosixPath(p).stem in names
    )
    return sorted(found)


__all__ = [
    "BLOCKED",
    "NOTHING",
    "READY",
    "GateCheck",
    "GateReport",
    "Judgement",
    "create_workstation",
    "gate",
    "judge",
    "related_tests",
    "run_in",
    "static_checks",
]
