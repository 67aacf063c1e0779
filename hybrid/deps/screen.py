"""What a repository's declarations may make the host fetch: named packages from the user's own
index or registry, nothing else.

pip builds a direct reference (``name @ file:///...``, an sdist URL, ``git+ssh://``) to read its
metadata even with ``--only-binary=:all:``: the package's setup code would run on the host. An
index or link option in a requirements file would point the host's pip somewhere the user never
configured. npm packs a ``file:`` spec from the host's disk and fetches ``git+ssh:`` with the
user's keys. So each of these is refused, with one line naming the entry, before anything is
fetched; what passes is written back in a normal form (never the text as the repository wrote
it), so no line can carry a second option into pip's files.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from hybrid.deps.files import shown
from hybrid.deps.models import Declared

_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
_VCS = re.compile(r"^(git|hg|svn|bzr)[+:]", re.IGNORECASE)
_ARCHIVE = re.compile(r"\.(whl|zip|tar|tar\.gz|tgz|tar\.bz2|tbz|tar\.xz|txz)$", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
HARMLESS_OPTIONS = frozenset(
    {"--pre", "--prefer-binary", "--only-binary", "--no-binary", "--require-hashes"}
)
"""Requirements-file options that choose nothing about where packages come from (and are never
passed on: the host's pip gets only the requirements, in normal form)."""

_DIRECT = "a direct reference ({}): refused, only packages from the configured index are fetched"


def direct_kind(text: str) -> str | None:
    """What ``text`` is if it names a package by location instead of by name: "a VCS URL",
    "a URL", "a local path", "an archive"; None for anything else."""
    value = text.strip()
    if _VCS.match(value):
        return "a VCS URL"
    if "://" in value or value.lower().startswith(("file:", "http:", "https:")):
        return "a URL"
    if value.startswith((".", "/", "~", "\\")) or re.match(r"^[A-Za-z]:[\\/]", value):
        return "a local path"
    if _ARCHIVE.search(value.split(";")[0].split("[")[0].strip()):
        return "an archive"
    return None


def is_self(text: str) -> bool:
    """``.``, ``./``, ``.[extra]``: the project itself (never fetched, its extras are read)."""
    return text.strip().split("[")[0] in (".", "./")


def requirement(spec: str, where: str) -> tuple[Requirement | None, str | None]:
    """``spec`` parsed, or the line that refuses it; (None, None) when it is not PEP 508 at all.

    The line names ``where`` (file and line) and the package, never the URL or the text."""
    if _CONTROL.search(spec):
        return None, f"deps: {where}: a requirement with a control character: refused"
    if "${" in spec:
        # pip expands ${VAR} from the host's environment inside requirements files.
        return None, f"deps: {where}: a requirement naming an environment variable: refused"
    try:
        req = Requirement(spec)
    except InvalidRequirement:
        kind = direct_kind(spec) or (direct_kind(spec.split("@", 1)[1]) if "@" in spec else None)
        return None, (f"deps: {where}: {_DIRECT.format(kind)}" if kind else None)
    if req.url:
        scheme = urlsplit(req.url).scheme or "path"
        return None, f"deps: {where}: {req.name} is {_DIRECT.format(f'{scheme}:')}"
    if kind := direct_kind(req.name):
        # It parses as a name, but pip installs "pkg-1.0.tar.gz" from a file of that name.
        return None, f"deps: {where}: {_DIRECT.format(kind)}"
    return req, None


def option(name: str, where: str) -> str | None:
    """The line that refuses a requirements-file option, None for a harmless one."""
    if name in HARMLESS_OPTIONS:
        return None
    return (
        f"deps: {where}: option {shown(name)} is refused (indexes, links, editable paths and "
        "build options come from your own pip configuration, never from the repository)"
    )


def valid_name(name: object) -> bool:
    return isinstance(name, str) and bool(_NAME.match(name))


def valid_version(version: object) -> bool:
    if not isinstance(version, str) or _CONTROL.search(version):
        return False
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def problems(declared: Declared) -> list[str]:
    """Every reason ``declared`` may not be resolved on the host (it may come from a caller,
    not from detect(): each requirement, pin and name is checked again here)."""
    found: list[str] = []
    for req in declared.python:
        parsed, why = requirement(req.spec, req.source)
        if parsed is None:
            found.append(why or f"deps: {req.source}: not a requirement (PEP 508): refused")
    for name, version in declared.locked.items():
        if not (valid_name(name) and valid_version(version)):
            found.append(
                f"deps: a lockfile pin {shown(name)!r} is not a name and a version: refused"
            )
    if declared.project is not None and not valid_name(declared.project):
        found.append(f"deps: the project name {shown(declared.project)!r} is not valid: refused")
    if declared.version is not None and not valid_version(declared.version):
        found.append("deps: the project's version is not a valid version: refused")
    return found


def normal(spec: str) -> str:
    """``spec`` as pip will read it: packaging's own rendering of the parsed requirement."""
    return str(Requirement(spec))


# -- npm ---------------------------------------------------------------------------------------

_NPM_NAME = re.compile(r"^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9~][a-z0-9._~-]*$")
_INTEGRITY = re.compile(r"^(sha512|sha384|sha256|sha1)-[A-Za-z0-9+/]+={0,2}$")
_SEMVER = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")


def node_entries(
    lockfile: Any, registries: list[str], where: str
) -> tuple[dict[str, tuple[str, str, str]], list[str]]:
    """(spec -> (name, version, integrity), refusals) for a package-lock's ``packages``.

    Only a registry tarball passes: a valid name, an exact version, an integrity hash, and
    (when the lockfile records it) a ``resolved`` URL on one of ``registries``. A ``file:``,
    ``link:``, git or other URL spec, a linked entry and a missing integrity are refused."""
    wanted: dict[str, tuple[str, str, str]] = {}
    refused: list[str] = []
    packages = lockfile.get("packages") if isinstance(lockfile, dict) else None
    if not isinstance(packages, dict):
        if isinstance(lockfile, dict) and lockfile.get("dependencies"):
            refused.append(f"deps: {where}: a lockfile without 'packages' (npm 7+): refused")
        return wanted, refused
    for key, entry in packages.items():
        if not key:
            continue  # the project itself
        entry_name = shown(str(key))
        if not isinstance(entry, dict):
            refused.append(f"deps: {where}: {entry_name}: not an object: refused")
            continue
        if entry.get("bundled") or entry.get("inBundle"):
            continue  # inside another package's tarball: checked with it
        if entry.get("link"):
            refused.append(f"deps: {where}: {entry_name} is a linked local package: refused")
            continue
        name = entry.get("name") or str(key).rsplit("node_modules/", 1)[-1]
        version, integrity = entry.get("version"), entry.get("integrity")
        resolved = entry.get("resolved")
        if not (isinstance(name, str) and _NPM_NAME.match(name)):
            refused.append(f"deps: {where}: {entry_name}: not a package name: refused")
            continue
        if not (isinstance(version, str) and _SEMVER.match(version)):
            text = version if isinstance(version, str) else ""
            kind = (
                "a file: spec"
                if text.startswith("file:")
                else "a link: spec"
                if text.startswith("link:")
                else "a git spec"
                if text.startswith("git") or "github:" in text
                else "a URL"
                if ":" in text
                else "not an exact version"
            )
            refused.append(
                f"deps: {where}: {entry_name} is {kind}: refused, only registry tarballs with "
                "an integrity hash are fetched"
            )
            continue
        if resolved is not None and not _on_registry(resolved, registries):
            refused.append(
                f"deps: {where}: {entry_name} resolves outside the configured npm registry: refused"
            )
            continue
        items = integrity.split() if isinstance(integrity, str) else []
        if not items or not all(_INTEGRITY.match(i) for i in items):
            refused.append(
                f"deps: {where}: {entry_name} has no integrity hash (sha512/sha1): refused"
            )
            continue
        wanted[f"{name}@{version}"] = (name, version, integrity)  # type: ignore[assignment]
    return wanted, refused


def _on_registry(resolved: object, registries: list[str]) -> bool:
    if not isinstance(resolved, str) or _CONTROL.search(resolved):
        return False
    url = urlsplit(resolved)
    if url.scheme not in ("https", "http") or url.username or url.password:
        return False
    for registry in registries:
        if registry == "*":
            return True  # npm rewrites every host to the configured registry
        base = urlsplit(registry)
        if (url.scheme, url.hostname, url.port) == (base.scheme, base.hostname, base.port):
            prefix = base.path.rstrip("/") + "/"
            if url.path.startswith(prefix) and ".." not in url.path.split("/"):
                return True
    return False
