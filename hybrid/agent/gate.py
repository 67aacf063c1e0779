"""The review gate: what a candidate patch must pass before a person looks at it.

Task tests pass; regressions pass; the touched paths are in scope (the ``scope`` check: allowed
prefixes, ``.env*``, CI workflows, credential files, lockfiles unless allowed); the policy scan
finds no secret added by the diff (the ``redact`` check) and no dependency change that has not
been admitted. The tests run in a fresh workstation holding a copy of the repository with the
patch applied by ``git apply``; the reviewed diff is computed on the host. It never merges or
pushes: the disposition is ``ready for human review`` or ``blocked`` with every reason.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, Field

from hybrid.errors import (
    DependencyError,
    InvalidDeclaration,
    InvalidDiff,
    InvalidInput,
    PolicyViolation,
)
from hybrid.paths import display
from hybrid.policy import Budget, SandboxSpec
from hybrid.results import ExecutionResult

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
    reviewed_diff: str = Field("", description="The diff as applied, computed on the host.")

    @property
    def ready(self) -> bool:
        return self.disposition == READY


def added_lines(patch: str) -> str:
    """The lines a unified diff adds (what the secret scan reads)."""
    return "\n".join(
        line[1:]
        for line in patch.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    )


def static_checks(
    patch: str,
    *,
    allow: Sequence[str] = (),
    deny: Sequence[str] = (),
    allow_lockfiles: bool = False,
    allow_dependencies: bool = False,
) -> tuple[list[GateCheck], list[str]]:
    """Scope, secrets and dependency checks (no sandbox): the checks and the touched paths.

    Raises InvalidDiff for a patch that does not parse.
    """
    from hybrid.checks import redact, scope

    report = scope(patch, allow=allow, deny=deny, allow_lockfiles=allow_lockfiles)
    files = [f.path for f in report.files]
    checks = [
        GateCheck(
            name="scope",
            passed=not report.violations,
            detail="; ".join(f"{v.message} ({v.rule})" for v in report.violations)
            or f"{len(files)} file(s) in scope",
        )
    ]
    scan = redact(added_lines(patch), max_bytes=8 * 1024 * 1024, label="patch")
    found = ", ".join(f"{kind} x{n}" for kind, n in sorted(scan.counts.items()))
    checks.append(
        GateCheck(
            name="secrets",
            passed=scan.ok and scan.redactions == 0,
            detail=f"the diff adds secrets: {found}"
            if scan.redactions
            else (scan.detail or "no secret added"),
        )
    )
    manifests = [p for p in files if DEPENDENCY_FILES.search(p)]
    checks.append(
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
    return checks, files


def run_in(ws: Any, patch: str, commands: Sequence[tuple[str, str]]) -> list[GateCheck]:
    """Apply ``patch`` in workstation ``ws`` and run each (name, shell command) there."""
    if len(patch.encode()) <= ARGUMENT_PATCH_BYTES and "\0" not in patch:
        # git apply runs as the sandbox's user and refuses paths outside the work tree.
        applied = ws.exec(["sh", "-c", 'printf "%s" "$0" | git apply --whitespace=nowarn -', patch])
    else:
        ws.put(patch.encode(), PATCH_PATH)
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
    spec: SandboxSpec | None = None,
    image: str | None = None,
    deps: bool | None = None,
    progress: Progress | None = None,
) -> GateReport:
    """Decide whether ``patch`` against ``repo`` is ready for human review; never merges.

    ``related`` is a test runner command (e.g. ``python3 -m pytest -q``) run on the test files
    the context graph relates to the touched files, as a second regression check.
    The workstation holds the project as ``hybrid validate`` makes it (``hybrid.agent.project``):
    ``deps`` installs its admitted dependencies offline from the cached layer (default: when the
    repository declares any and the tier starts from an image); dependencies that cannot be
    admitted or installed block, with the reason.
    """
    say = progress or (lambda message: None)
    repo = Path(repo)
    if not repo.is_dir():
        raise InvalidInput(f"{display(repo)}: not a directory (--repo names the repository)")
    if not test.strip():
        raise InvalidInput("the gate needs a test command (--test)")
    say("static checks: scope, secrets, dependencies")
    try:
        checks, files = static_checks(
            patch,
            allow=allow,
            deny=deny,
            allow_lockfiles=allow_lockfiles,
            allow_dependencies=allow_dependencies,
        )
    except InvalidDiff as exc:
        check = GateCheck(name="patch", passed=False, detail=f"the patch does not parse: {exc}")
        return GateReport(disposition=BLOCKED, reasons=[check.detail], checks=[check])
    commands = [("test", test)] + ([("regression", regression)] if regression else [])
    tests: list[str] = []
    if related:
        tests = related_tests(repo, files)
        if tests:
            say(f"related tests: {', '.join(tests)}")
            commands.append(
                ("related tests", f"{related} {' '.join(shlex.quote(t) for t in tests)}")
            )
        else:
            checks.append(GateCheck(name="related tests", passed=True, detail="none found"))
    spec = spec or DEFAULT_SPEC
    static = checks
    # The image's Python can be what stops the tests (the runner the project pins does not run
    # on it, or they use what it removed): as validate does, the other Pythons the engine holds
    # are tried, unless the caller named the image.
    for where in [image, *([] if image else _other_pythons())]:
        say("workstation: installing the dependencies, copying the repository in")
        try:
            made = _workstation(repo, spec, where, deps)
        except (DependencyError, PolicyViolation, InvalidDeclaration) as exc:
            detail = f"the project's dependencies cannot be installed: {str(exc).splitlines()[0]}"
            check = GateCheck(name="environment", passed=False, detail=detail)
            return GateReport(
                disposition=BLOCKED, reasons=[detail], checks=[*static, check], files=files
            )
        with made as ws:
            say("applying the patch and running the tests")
            checks = static + run_in(ws, patch, commands)
            for check in checks:
                if check.name == "related tests" and check.result is not None:
                    check.detail += f" ({', '.join(tests)})"
            reviewed = ws.diff()
        if not _python_bound(checks):
            break
    reasons = [c.detail or f"{c.name} failed" for c in checks if not c.passed]
    return GateReport(
        disposition=BLOCKED if reasons else READY,
        reasons=reasons,
        checks=checks,
        files=files,
        reviewed_diff=reviewed,
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


def _workstation(repo: Path, spec: SandboxSpec, image: str | None, deps: bool | None) -> Any:
    """The gate's workstation: the project as validation makes it (deps, generated files)."""
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
    "READY",
    "GateCheck",
    "GateReport",
    "gate",
    "related_tests",
    "static_checks",
]
