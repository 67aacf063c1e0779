"""Resolve and download on the host, through the user's own pip and npm configuration.

pip resolves for the workstation image's interpreter and platform (``--python-version``,
``--platform``, ``--abi``), which pip allows only for wheels: nothing the project or its
dependencies ship runs on the host. Index, find-links, certificates and constraints come from
the user's pip configuration (no host name is written here). npm packs exactly the tarballs
the project's lockfile names, with npm's own registry and CA settings, and their integrity
is checked against the lockfile.

What the repository declared is screened first (``hybrid.deps.screen``): a direct reference,
a VCS or local spec, a lockfile entry off the registry or without an integrity hash is refused
before anything is fetched, and pip and npm run from a scratch directory, reading only the
normal form of what passed (never a line as the repository wrote it).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from packaging.requirements import Requirement as PackagingRequirement
from packaging.specifiers import SpecifierSet
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from hybrid.deps import files, npm_lock, released, screen, sdist, store
from hybrid.deps.models import Artifact, Declared, Manifest, Target
from hybrid.errors import DependencyError, InvalidDeclaration, PolicyViolation
from hybrid.paths import cache_dir

_FORMAT = "2"  # bump when what a lock records changes
_OLDEST_GLIBC_MINOR = 5  # manylinux1


def lock(
    repo: Path,
    declared: Declared,
    target: Target,
    *,
    refresh: bool = False,
    exclude_newer: datetime | None = None,
) -> Manifest:
    """The manifest of what ``declared`` resolves to for ``target``, downloaded into the store.

    ``exclude_newer`` resolves the packages the project names as of that time: none at a
    release the index says was published after it. Kept per (inputs, target, time): an unchanged
    project is not resolved again (``refresh`` forces it). PolicyViolation, before anything is
    fetched, for whatever ``declared`` names that is not a package from the index or registry.
    """
    refused = screen.problems(declared)
    if refused:
        raise PolicyViolation(refused)
    saved = cache_dir("deps", "locks") / f"{_key(declared, target, exclude_newer)}.json"
    if saved.is_file() and not refresh:
        with contextlib.suppress(ValueError):
            manifest = Manifest.model_validate_json(saved.read_text())
            # A pruned store downloads again; a changed file is admission's to refuse.
            if all(store.path_of(a.sha256).is_file() for a in manifest.artifacts):
                # Same requirements from edited files (a version bump): the same resolution.
                return manifest.model_copy(
                    update={
                        "requirements": declared.python,
                        "inputs": declared.inputs,
                        "entry_points": declared.entry_points,
                    }
                )
    artifacts = _python(declared, target, exclude_newer) + _node(repo, declared)
    manifest = Manifest(
        project=declared.project,
        target=target,
        artifacts=sorted(artifacts, key=lambda a: (a.ecosystem, a.name, a.version)),
        requirements=declared.python,
        node_lockfile=declared.node,
        paths=declared.paths,
        version=declared.version,
        entry_points=declared.entry_points,
        exclude_newer=exclude_newer,
        inputs=declared.inputs,
    )
    tmp = saved.with_suffix(".tmp")
    tmp.write_text(manifest.model_dump_json(indent=1))
    os.replace(tmp, saved)
    return manifest


def _key(declared: Declared, target: Target, exclude_newer: datetime | None) -> str:
    """What decides a resolution: the requirements, pins and hashes declared (not the bytes of
    the files around them), the target, and for Node the lockfile itself."""
    body = {
        "format": _FORMAT,
        "target": target.model_dump(),
        "python": sorted({r.spec for r in declared.python}),
        "locked": declared.locked,
        "hashes": {k: sorted(v) for k, v in declared.hashes.items()},
        "node": declared.node and declared.inputs,
        "paths": declared.paths,
        "project": declared.project,
        "version": declared.version,  # what a test tool needing the project resolves against
    }
    if exclude_newer is not None:
        body["exclude_newer"] = exclude_newer.isoformat()
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def platforms(target: Target) -> list[str]:
    """Every wheel platform tag the image runs, newest first (pip does not expand manylinux_2_X)."""
    arch = target.machine
    tags: list[str] = []
    if target.glibc:
        major, _, minor = target.glibc.partition(".")
        if major == "2" and minor.isdigit():
            for m in range(int(minor), _OLDEST_GLIBC_MINOR - 1, -1):
                tags.append(f"manylinux_2_{m}_{arch}")
                legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}.get(m)
                if legacy:
                    tags.append(f"{legacy}_{arch}")
    tags.append(f"linux_{arch}")
    return tags


def _python(declared: Declared, target: Target, exclude_newer: datetime | None) -> list[Artifact]:
    specs = list(dict.fromkeys(screen.normal(r.spec) for r in declared.python))
    if not specs:
        return []
    nodot = target.python.replace(".", "")
    with tempfile.TemporaryDirectory(prefix="hybrid-deps-") as work:
        out = Path(work) / "files"
        out.mkdir()
        (Path(work) / "requirements.txt").write_text("\n".join(specs) + "\n")
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--dest",
            str(out),
            "--only-binary=:all:",
            "--python-version",
            target.python,
            "--implementation",
            "cp",
            "--abi",
            f"cp{nodot}",
            "--abi",
            "abi3",
            "--abi",
            "none",
            "--progress-bar",
            "off",
            "--disable-pip-version-check",
            "-r",
            str(Path(work) / "requirements.txt"),
        ]
        for tag in platforms(target):
            command += ["--platform", tag]
        constraints = Path(work) / "constraints.txt"
        pins = [f"{n}=={v}" for n, v in sorted(declared.locked.items())]
        _write_constraints(constraints, pins, {})
        command += ["-c", str(constraints)]
        bounds: dict[str, str] = {}  # name -> the specifier that leaves out later releases
        # A package with no wheel: its source enters, a stand-in wheel lets pip resolve around
        # it, and the loop goes on until pip finds a wheel (or a source) for everything.
        stubs = Path(work) / "stubs"
        stubs.mkdir()
        sources: dict[str, sdist.Source] = {}
        extra: list[str] = []
        own = None
        if declared.project and declared.version:
            # The project as installed at its own release, as `pip install -e .` would have it:
            # a test tool that needs it (pytest needs pluggy) resolves to a version that works
            # with this checkout, not today's release that needs a newer one. It never enters.
            own = sdist.stand_in(stubs, declared.project, declared.version)
            extra.append(pin := f"{declared.project}=={declared.version}")
        while True:
            (Path(work) / "requirements.txt").write_text("\n".join([*specs, *extra]) + "\n")
            links = [f"--find-links={link}" for link in [*_find_links(), str(stubs)]]
            links = links if any(stubs.iterdir()) else []
            done = subprocess.run(
                [*command, *links],
                capture_output=True,
                text=True,
                check=False,
                cwd=work,
            )
            if done.returncode == 0:
                late = _too_new(out, declared, exclude_newer, bounds)
                if not late:
                    break
                # Chosen at releases too new for the date: bound them and resolve again.
                bounds |= late
                _write_constraints(constraints, pins, bounds)
                for path in out.iterdir():
                    path.unlink()
                continue
            if stuck := _unsatisfied_bound(done.stdout + done.stderr, bounds):
                # Nothing published by the date installs here (no wheel for this interpreter,
                # as an old C extension on a newer Python): the next release that does.
                bounds[stuck] = ""
                _write_constraints(constraints, pins, bounds)
                continue
            wanted = sdist.missing(done.stderr)
            if wanted is None:
                # A lockfile's pin with no wheel is a conflict to pip (the pin against "only
                # binaries"), not a missing distribution: the same source fallback.
                wanted = _wheelless_pin(command, done.stdout, declared.locked, sources, links)
            if wanted is None and own is not None:
                # Nothing resolves around the project at that release (a version its files
                # state ahead of what was published): resolve as if it were not installed.
                extra.remove(pin)
                own.unlink()
                (out / own.name).unlink(missing_ok=True)
                own = None
                continue
            if wanted is None or canonicalize_name(_req_name(wanted)) in sources:
                raise DependencyError(
                    f"pip could not resolve the project's dependencies: {_why(done.stderr)}"
                )
            (Path(work) / "sources").mkdir(exist_ok=True)
            limit = bounds.get(canonicalize_name(_req_name(wanted)))
            if limit:
                narrowed = PackagingRequirement(wanted)
                narrowed.specifier &= SpecifierSet(limit)
                wanted = str(narrowed)
            source = sdist.fetch(wanted, Path(work) / "sources", cwd=Path(work))
            sources[source.name] = source
            source.stand_in(stubs)
            extra += [b for b in source.build_requires if b not in extra]
        for stand_in in stubs.iterdir():
            (out / stand_in.name).unlink(missing_ok=True)
        for source in sources.values():
            shutil.copy2(source.path, out / source.path.name)
        found = []
        refused = []
        for path in sorted(out.iterdir()):
            name, version = _name_version(path.name)
            digest, size = store.add(path)
            allowed = declared.hashes.get(f"{name}=={version}")
            if allowed and digest not in allowed:
                refused.append(
                    f"deps: {path.name}: sha256 {digest[:16]}... is not one the lockfile pins for "
                    f"{name} {version}; refused"
                )
            found.append(
                Artifact(
                    ecosystem="python",
                    name=name,
                    version=version,
                    filename=path.name,
                    sha256=digest,
                    size=size,
                )
            )
        if refused:
            raise PolicyViolation(refused)
        return found


def _too_new(
    out: Path, declared: Declared, exclude_newer: datetime | None, bounds: dict[str, str]
) -> dict[str, str]:
    """The bound of each package the project names that pip chose at a release published after
    ``exclude_newer`` and is not yet bounded ("" when nothing was published by then).

    Only what the project names is bounded: its tests are written against those (a pytest
    that later turned a deprecation into an error). What they depend on stays free, so it can
    be the release that runs on the image's interpreter (py 1.10 breaks on Python 3.11).
    A locked pin is the project's own choice and stays.
    """
    if exclude_newer is None:
        return {}
    named = {canonicalize_name(_req_name(r.spec)) for r in declared.python}
    named -= {canonicalize_name(n) for n in [*declared.locked, *bounds, declared.project or ""]}
    chosen = {n: v for n, v in (_name_version(p.name) for p in out.iterdir()) if n in named}
    late = released.too_new(chosen, exclude_newer) if chosen else []
    return {name: released.bound(name, exclude_newer) or "" for name in late}


def _wheelless_pin(
    command: list[str],
    output: str,
    locked: dict[str, str],
    sources: dict[str, sdist.Source],
    links: list[str],
) -> str | None:
    """The locked pin in pip's conflict that has no wheel for the target (``name==version``),
    or None: a conflict between wheels stays one."""
    named = re.findall(r"The user requested \(constraint\) ([A-Za-z0-9._-]+)==(\S+)", output)
    pins = [
        (canonicalize_name(n), v)
        for n, v in named
        if locked.get(canonicalize_name(n)) == v and canonicalize_name(n) not in sources
    ]
    if not pins:
        return None
    # The same target and index as the resolution, one pin, nothing else.
    probe = list(command)
    for flag in ("-r", "-c"):
        at = probe.index(flag)
        del probe[at : at + 2]
    with tempfile.TemporaryDirectory(prefix="hybrid-deps-probe-") as scratch:
        probe[probe.index("--dest") + 1] = scratch
        for name, version in pins:
            done = subprocess.run(
                [*probe, *links, "--no-deps", f"{name}=={version}"],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0 and sdist.missing(done.stderr):
                return f"{name}=={version}"
    return None


def _write_constraints(path: Path, pins: list[str], bounds: dict[str, str]) -> None:
    path.write_text(
        "".join(f"{c}\n" for c in [*pins, *(f"{n}{b}" for n, b in bounds.items() if b)])
    )


def _unsatisfied_bound(output: str, bounds: dict[str, str]) -> str | None:
    """The bounded package pip names in a conflict (its bound leaves nothing it can install;
    pip explains a conflict on stdout)."""
    for found in re.finditer(r"The user requested \(constraint\) ([A-Za-z0-9._-]+)", output):
        name = canonicalize_name(found.group(1))
        if bounds.get(name):
            return name
    return None


def _find_links() -> list[str]:
    """The user's configured find-links (a --find-links option replaces them, so repeat them)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    links: list[str] = []
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            links += value.strip().strip("'\"").split()
    return list(dict.fromkeys(links))


def _req_name(spec: str) -> str:
    return re.split(r"[\s\[<>=!~;@(]", spec, maxsplit=1)[0]


def _name_version(filename: str) -> tuple[str, str]:
    try:
        name, version, _build, _tags = parse_wheel_filename(filename)
        return str(name), str(version)
    except InvalidWheelFilename:
        pass
    try:
        name, version = parse_sdist_filename(filename)
        return str(name), str(version)
    except InvalidSdistFilename:
        stem = filename.rsplit("-", 1)
        return canonicalize_name(stem[0]), stem[-1]


def _why(stderr: str) -> str:
    lines = [
        line.strip()
        for line in stderr.splitlines()
        if line.strip().startswith("ERROR") or "conflict is caused by" in line
    ]
    return " / ".join(lines[-3:]) or (stderr.strip().splitlines() or ["no output"])[-1]


def _node(repo: Path, declared: Declared) -> list[Artifact]:
    """Every tarball the Node lockfile names, packed by npm and checked against its integrity.

    Only registry tarballs with an integrity hash: every other entry (``file:``, ``link:``, git,
    a URL off the configured registry, no integrity) is refused before npm runs."""
    if not declared.node:
        return []
    npm = shutil.which("npm")
    if npm is None:
        raise DependencyError(
            "the project has a Node lockfile but npm is not installed on this host"
        )
    try:
        raw = files.read(repo, declared.node)
    except files.Unreadable as exc:
        raise PolicyViolation([f"deps: {exc}: not read, refused"]) from None
    if raw is None:
        raise InvalidDeclaration(f"{files.shown(declared.node)}: no such file")
    try:
        lockfile = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidDeclaration(f"{files.shown(declared.node)}: not valid JSON") from None
    if isinstance(lockfile, dict) and not lockfile.get("packages"):
        # A v1 lockfile (npm 5-6) holds only the nested tree: screened in the v3 form it installs as.
        lockfile = {"packages": npm_lock.packages(lockfile)}
    wanted, refused = screen.node_entries(lockfile, _npm_registries(npm), declared.node)
    if refused:
        raise PolicyViolation(refused)
    artifacts = [_store_text(repo, "package.json"), _store_text(repo, declared.node)]
    if not wanted:
        return artifacts
    with tempfile.TemporaryDirectory(prefix="hybrid-npm-") as work:
        done = subprocess.run(
            [
                npm,
                "pack",
                "--json",
                "--ignore-scripts",
                "--pack-destination",
                work,
                *sorted(wanted),
            ],
            capture_output=True,
            text=True,
            check=False,
            cwd=work,
        )
        if done.returncode != 0:
            raise DependencyError(
                f"npm could not fetch the lockfile's packages: {_why(done.stderr)}"
            )
        refused = []
        for row in json.loads(done.stdout):
            spec = f"{row['name']}@{row['version']}"
            if spec not in wanted or Path(row["filename"]).name != row["filename"]:
                refused.append(f"deps: npm packed {files.shown(spec)}, which was not asked for")
                continue
            name, version, integrity = wanted[spec]
            path = Path(work) / row["filename"]
            if not _integrity_ok(path, integrity):
                refused.append(
                    f"deps: {spec}: tarball does not match the lockfile's integrity; refused"
                )
                continue
            digest, size = store.add(path)
            artifacts.append(
                Artifact(
                    ecosystem="node",
                    name=name,
                    version=version,
                    filename=row["filename"],
                    sha256=digest,
                    size=size,
                )
            )
        if refused:
            raise PolicyViolation(refused)
    return artifacts


def _npm_registries(npm: str) -> list[str]:
    """Where a lockfile's ``resolved`` may point: the registries the user's npm configuration
    names (``registry``, ``@scope:registry``), and the host npm itself rewrites to them
    (``replace-registry-host``: npm's default registry for "npmjs", "*" for "always").

    Asked from a scratch directory, so no project's .npmrc takes part."""
    config, why = _npm_config(npm, [])
    found = [
        str(value)
        for key, value in config.items()
        if (key == "registry" or key.endswith(":registry")) and isinstance(value, str)
    ]
    if not found:
        raise DependencyError(f"npm config list gave no registry: {why}; nothing was fetched")
    replace = str(config.get("replace-registry-host", "npmjs"))
    if replace == "always":
        found.append("*")
    elif replace == "npmjs":
        # npm's built-in registry, as npm states it with no configuration file of anyone's.
        builtin, _ = _npm_config(npm, ["--userconfig", os.devnull, "--globalconfig", os.devnull])
        default = builtin.get("registry")
        if isinstance(default, str):
            found.append(default)
    elif replace != "never":
        found += [f"https://{replace}/", f"http://{replace}/"]
    return list(dict.fromkeys(found))


def _npm_config(npm: str, extra: list[str]) -> tuple[dict[str, object], str]:
    env = None
    if extra:
        env = {k: v for k, v in os.environ.items() if not k.lower().startswith("npm_config_")}
    with tempfile.TemporaryDirectory(prefix="hybrid-npmrc-") as work:
        try:
            done = subprocess.run(
                [npm, "config", "list", "--json", *extra],
                capture_output=True,
                text=True,
                check=False,
                cwd=work,
                timeout=120,
                env=env,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {}, str(exc)
    try:
        config = json.loads(done.stdout) if done.returncode == 0 else {}
    except ValueError:
        config = {}
    return (config if isinstance(config, dict) else {}), _why(done.stderr)


def _store_text(repo: Path, rel: str) -> Artifact:
    data = files.read(repo, rel)  # read (and refused if unsafe) by detect() already
    if data is None:
        raise InvalidDeclaration(f"{files.shown(rel)}: no such file")
    digest, size = store.add_bytes(data)
    return Artifact(ecosystem="node", name=rel, version="", filename=rel, sha256=digest, size=size)


def _integrity_ok(path: Path, integrity: str) -> bool:
    data = path.read_bytes()
    for item in integrity.split():
        algo, _, value = item.partition("-")
        if algo in ("sha512", "sha384", "sha256", "sha1"):
            try:
                expected = base64.b64decode(value, validate=True)
            except ValueError:
                continue
            if hashlib.new(algo, data).digest() == expected:
                return True
    return False
