"""A project's workstation as validation and the gate make it: the project as its tests expect.

Its admitted dependencies installed offline from the cached layer (``hybrid.deps``), and the
files a build backend would generate (the version module of setuptools-scm and hatch-vcs)
present, even when the repository ignores them: the project runs from the workspace unbuilt.
The layer's venv and ``node_modules/.bin`` lead a workstation's PATH, so the project's own
test runner (pytest of its pins, jest, mocha, tap) is the one a test command finds.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tomllib
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from hybrid.errors import InvalidInput

if TYPE_CHECKING:
    from hybrid.policy import SandboxSpec
    from hybrid.workstation.base import Backend, Workstation

DECLARATIONS = (
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "requirements.txt",
    "requirements-dev.txt",
    "requirements-test.txt",
    "Pipfile",
    "uv.lock",
    "poetry.lock",
    "package.json",
)
"""Files at a repository's root that declare what it needs (dependencies on by default)."""

DEPS_TIERS = ("docker", "gvisor")
"""Tiers whose workstations start from an engine image, so from a dependency layer."""

_MAX_DECLARATION = 1 << 20


def declares_dependencies(repo: Path) -> bool:
    """Whether ``repo`` declares what it needs: a manifest at its root, or requirements files."""
    repo = Path(repo)
    if any(_regular(repo / name) for name in DECLARATIONS):
        return True
    with contextlib.suppress(OSError):
        return any(_regular(p) for p in (repo / "requirements").glob("*.txt"))
    return False


def generated_files(checkout: Path, version: str) -> dict[str, bytes]:
    """The version modules a build of ``checkout`` would write (hatch-vcs ``version-file``,
    setuptools-scm ``version_file``/``write_to``) and that it lacks: relative path -> content."""
    text = _read(Path(checkout) / "pyproject.toml")
    if text is None:
        return {}
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}
    tool = data.get("tool") or {}
    hatch = ((tool.get("hatch") or {}).get("build") or {}).get("hooks") or {}
    scm = tool.get("setuptools_scm") or {}
    parts = tuple(int(p) if p.isdigit() else p for p in version.split("."))
    body = (
        f"__version__ = version = {version!r}\n__version_tuple__ = version_tuple = {parts!r}\n"
    ).encode()
    found: dict[str, bytes] = {}
    for rel in (
        (hatch.get("vcs") or {}).get("version-file"),
        scm.get("version_file"),
        scm.get("write_to"),
    ):
        if not isinstance(rel, str) or not rel.endswith(".py"):
            continue
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts or ".git" in pure.parts:
            continue  # a path out of the project (or into its git dir) is no version module
        if not os.path.lexists(Path(checkout) / rel):
            found[pure.as_posix()] = body
    return found


def write_generated(checkout: Path, version: str) -> None:
    """Write :func:`generated_files` into ``checkout`` (an export of ours, not a user's tree)."""
    for rel, body in generated_files(checkout, version).items():
        target = Path(checkout) / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body)


def project_workstation(
    backend: Backend,
    repo: Path,
    spec: SandboxSpec,
    *,
    image: str | None = None,
    deps: bool = True,
    version: str | None = None,
) -> Workstation:
    """A workstation holding ``repo``, its dependencies installed when ``deps`` (from the cached
    layer, network off) and the version modules a build would write put in (as ``version``,
    default the repository's latest tag, else 0.0.0).

    Raises what ``hybrid.deps.up`` raises (DependencyError, PolicyViolation, InvalidDeclaration)
    when the dependencies cannot be admitted or installed.
    """
    if deps:
        from hybrid import deps as deps_api

        ws = deps_api.up(backend, repo, spec, image=image)
    else:
        ws = backend.create(spec, image=image, repo=repo)
    try:
        if version is None:
            from hybrid.deps.detect import tag_release

            version = tag_release(repo) if (Path(repo) / ".git").exists() else None
        for rel, body in generated_files(repo, version or "0.0.0").items():
            ws.put(body, rel)  # after the copy-in: a user's tree is never written to
    except BaseException:
        ws.remove()
        raise
    return ws


def _regular(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return stat.S_ISREG(os.lstat(path).st_mode)
    return False


def _read(path: Path) -> str | None:
    """A regular file of the repository (never through a link), bounded; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = file.read(_MAX_DECLARATION + 1)
    if len(data) > _MAX_DECLARATION:
        raise InvalidInput(f"{path.name}: over {_MAX_DECLARATION} bytes, not read")
    return data.decode("utf-8", errors="replace")


__all__ = [
    "DECLARATIONS",
    "DEPS_TIERS",
    "declares_dependencies",
    "generated_files",
    "project_workstation",
    "write_generated",
]
