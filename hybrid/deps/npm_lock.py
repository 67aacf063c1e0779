"""The installed tree an npm lockfile names, whatever its version.

npm 7+ writes ``packages`` (install path -> entry, v2 and v3 lockfiles); npm 5-6 wrote only a
nested ``dependencies`` tree (v1). A v1 lockfile read for ``packages`` names nothing, so an
install from it silently installed nothing (json5's tests then found no mocha): the v1 tree is
read into the same install paths and entries, and an install is handed that form.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

_MAX_MANIFEST = 1 << 20
_INSTALL_SCRIPTS = ("preinstall", "install", "postinstall")

_ROOT_FIELDS = (
    "name",
    "version",
    "dependencies",
    "devDependencies",
    "optionalDependencies",
    "peerDependencies",
)


def packages(lockfile: dict[str, Any], manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """``lockfile``'s packages by install path (``node_modules/a/node_modules/b``); a v1 tree
    converted, its root entry taken from ``manifest`` (the project's package.json)."""
    found = lockfile.get("packages")
    if isinstance(found, dict) and found:
        return found
    tree = lockfile.get("dependencies")
    if not isinstance(tree, dict):
        return {}
    root = {k: v for k, v in (manifest or {}).items() if k in _ROOT_FIELDS}
    out: dict[str, Any] = {"": root}
    _walk(tree, "", out)
    return out


def upgraded(lockfile: dict[str, Any], manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """``lockfile`` in the v3 form (``packages`` only), which npm installs offline as it is: npm
    upgrades a v1 lockfile by asking the registry for each package's metadata."""
    if isinstance(lockfile.get("packages"), dict) and lockfile["packages"]:
        return lockfile
    data = {k: v for k, v in lockfile.items() if k != "dependencies"}
    data["lockfileVersion"] = 3
    data["packages"] = packages(lockfile, manifest)
    return data


def tarball_details(path: Path) -> dict[str, Any]:
    """What a v3 lockfile entry says of a package that a v1 tree does not, read from its
    tarball's package.json (data only, nothing runs): its commands (``bin``, which npm links
    into node_modules/.bin only when the lockfile names them) and whether it has install
    scripts (which npm runs only when the lockfile says so)."""
    try:
        with tarfile.open(path) as archive:
            members = {m.name: m for m in archive if m.isfile()}
            top = [n for n in members if n.count("/") == 1 and n.endswith("/package.json")]
            data = archive.extractfile(members[top[0]]) if top else None
            manifest = json.loads(data.read(_MAX_MANIFEST)) if data else {}
    except (OSError, tarfile.TarError, ValueError):
        return {}
    if not isinstance(manifest, dict):
        return {}
    details: dict[str, Any] = {}
    bin_ = manifest.get("bin")
    name = str(manifest.get("name", "")).rsplit("/", 1)[-1]
    commands = {name: bin_} if isinstance(bin_, str) and name else bin_
    if isinstance(commands, dict):
        # Only commands whose file the package ships: npm fails the whole install on one
        # that is not there (ENOENT), where reading the package itself it passes it over.
        root = top[0].split("/", 1)[0]
        shipped = {
            k: v
            for k, v in commands.items()
            if isinstance(v, str) and f"{root}/{PurePosixPath(v.removeprefix('./'))!s}" in members
        }
        if shipped:
            details["bin"] = shipped
    scripts = manifest.get("scripts")
    if isinstance(scripts, dict) and any(k in scripts for k in _INSTALL_SCRIPTS):
        details["hasInstallScript"] = True
    return details


def _walk(tree: dict[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for name, entry in tree.items():
        if not isinstance(entry, dict):
            continue
        where = f"{prefix}node_modules/{name}"
        converted: dict[str, Any] = {}
        for key in ("version", "resolved", "integrity", "dev", "optional"):
            if key in entry:
                converted[key] = entry[key]
        if entry.get("bundled"):
            converted["inBundle"] = True
        requires = entry.get("requires")
        if isinstance(requires, dict) and requires:
            converted["dependencies"] = requires
        out[where] = converted
        nested = entry.get("dependencies")
        if isinstance(nested, dict):
            _walk(nested, f"{where}/", out)


__all__ = ["packages", "tarball_details", "upgraded"]
