"""Installed environments kept as engine images, keyed by (image, manifest).

A layer is the workstation image plus ``/opt/hybrid/venv`` (and ``/opt/hybrid/node``), built
once in a throwaway container with the network off and the admitted artifacts mounted
read-only, then committed. Workstations start from it, so a second ``ws up`` of an unchanged
project installs nothing; a changed lockfile is a new manifest and so a new layer. Each
layer's manifest and last use are kept under the cache directory, for ``hybrid cache`` and
least-recently-used eviction.
"""

from __future__ import annotations

import configparser
import contextlib
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from hybrid.deps import npm_lock, store
from hybrid.deps.models import Artifact, Manifest, Target
from hybrid.errors import DependencyError, WorkstationNotFound
from hybrid.paths import cache_dir
from hybrid.workstation import jobuser

REPOSITORY = "hybrid-deps"
KIND = "deps"
LABEL_KEY = "hybrid.deps.key"
LABEL_IMAGE = "hybrid.deps.image"
PREFIX = "/opt/hybrid"
VENV = f"{PREFIX}/venv"
NODE = f"{PREFIX}/node"
_FORMAT = "7"  # bump when the install script changes what a layer holds
_STAGE = "/hybrid-deps"

_SCRIPT = r"""set -eu
export HOME=/tmp PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=
if [ -s {stage}/python.txt ] || [ -s {stage}/paths.txt ]; then
  # The image's own pip, through --system-site-packages: no network, no second copy of pip.
  # A project with nothing to install still gets the venv: its `python`, and its source on
  # sys.path. The host resolved the whole set (python.txt pins every artifact), so --no-deps,
  # as pip-sync does: the project itself is not in it, while what needs it is.
  python3 -m venv --without-pip --system-site-packages {venv}
  if [ -s {stage}/python.txt ]; then
    {venv}/bin/python -m pip install --no-index --find-links {stage}/python --ignore-installed \
      --no-deps --no-warn-script-location -r {stage}/python.txt
  fi
  site=$({venv}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for p in $(cat {stage}/paths.txt); do echo "$p" >> "$site/_hybrid_project.pth"; done
  # The project runs from the workspace uninstalled; its own metadata (name, its release or a
  # placeholder) lets importlib.metadata.version(project) answer as it would when installed.
  if [ -s {stage}/project.txt ]; then
    read -r name version < {stage}/project.txt
    version=${{version:-0+unknown}}
    # A dependency can need the project itself (hypothesis needs attrs; pytest needs packaging
    # and pluggy): its released copy in the venv would shadow the checkout being tested.
    {venv}/bin/python -m pip uninstall -y -q "$name" >/dev/null 2>&1 || true
    info="$site/$(echo "$name" | tr - _)-$version.dist-info"
    mkdir -p "$info"
    printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$name" "$version" > "$info/METADATA"
    echo hybrid > "$info/INSTALLER"
    : > "$info/RECORD"
    # Its entry points, and a command for each console script (tests run `dotenv run ...`).
    if [ -s {stage}/entry_points.txt ]; then
      cp {stage}/entry_points.txt "$info/entry_points.txt"
      {venv}/bin/python - "$info/entry_points.txt" {venv}/bin <<'PY'
import configparser, os, re, sys
points = configparser.ConfigParser(interpolation=None, delimiters=("=",))
points.optionxform = str
points.read(sys.argv[1])
for group in ("console_scripts", "gui_scripts"):
    for name, ref in points.items(group) if points.has_section(group) else ():
        module, _, attr = re.sub(r"\s*\[.*\]\s*$", "", ref).partition(":")
        head = attr.split(".")[0]
        if not all(re.fullmatch(r"\w+(\.\w+)*", n) for n in (module, attr or "x", name.replace("-", "_"))):
            continue  # neither code nor a path: one line of the launcher, one file in bin/
        call = f"from {{module}} import {{head}}\nsys.exit({{attr}}())" if attr else (
            f"import runpy\nrunpy.run_module({{module!r}}, run_name='__main__')")
        path = f"{{sys.argv[2]}}/{{name}}"
        with open(path, "w") as out:
            out.write(f"#!{{sys.executable}}\nimport sys\n{{call}}\n")
        os.chmod(path, 0o755)
PY
    fi
  fi
fi
if [ -s {stage}/node.txt ]; then
  command -v npm >/dev/null || {{ echo "the image has no npm: build one with hybrid image bootstrap --profile node" >&2; exit 3; }}
  mkdir -p {node}
  cp {stage}/node-project/* {node}/
  export npm_config_cache=/tmp/npm-cache npm_config_update_notifier=false
  cd {node} && npm ci --offline --no-audit --no-fund
fi
"""


class Layer(BaseModel):
    """An installed environment the engine holds."""

    key: str
    ref: str = Field(description="Image reference workstations start from.")
    image: str = Field(description="The image it was built on.")
    project: str | None = None
    size_bytes: int = Field(0, description="Bytes it adds to the image it was built on.")
    artifacts: int = 0
    last_used: float = 0.0
    hit: bool = Field(False, description="True when an existing layer was reused.")
    seconds: float = Field(0.0, description="Time spent building it (0 for a hit).")


def key_of(image_id: str, manifest: Manifest) -> str:
    # The project's name is in the layer too (its placeholder metadata); so is the owner of
    # /opt/hybrid, the jobs' uid (a layer made for other ids is not theirs to write).
    body = f"{_FORMAT}\0{jobuser.USER}\0{image_id}\0{manifest.digest()}\0{manifest.project or ''}"
    return hashlib.sha256(body.encode()).hexdigest()


def _record(key: str) -> Path:
    return cache_dir("deps", "layers") / f"{key}.json"


def manifest_of(key: str) -> Manifest | None:
    """The manifest a layer was built from (None when its record is gone)."""
    with contextlib.suppress(OSError, ValueError):
        return Manifest.model_validate_json(_record(key).read_text())
    return None


def target(image: str) -> Target:
    """The interpreter and platform of ``image``, asked once per image id (network off)."""
    from hybrid.workstation.docker import client, seccomp, translate

    api = client().api
    with translate(f"inspect {image}"):
        try:
            image_id = api.inspect_image(image)["Id"]
        except Exception as exc:
            if type(exc).__name__ == "ImageNotFound":
                raise WorkstationNotFound(
                    f"no image {image} (build it with: hybrid image bootstrap)"
                ) from None
            raise
        saved = cache_dir("deps", "targets") / f"{image_id.rpartition(':')[2]}.json"
        with contextlib.suppress(OSError, ValueError):
            return Target.model_validate_json(saved.read_text())
        probe = (
            "import json, os, platform, shutil, sys;"
            "print(json.dumps({'python': '%d.%d' % sys.version_info[:2],"
            "'glibc': (os.confstr('CS_GNU_LIBC_VERSION') or ' ').split(' ')[1],"
            "'machine': platform.machine(), 'npm': bool(shutil.which('npm'))}))"
        )
        out = client().containers.run(
            image,
            ["python3", "-c", probe],
            remove=True,
            network_disabled=True,
            network_mode="none",
            user=jobuser.USER,
            read_only=True,
            cap_drop=["ALL"],
            security_opt=seccomp.security_opt(),
            mem_limit="256m",
            pids_limit=32,
        )
    found = Target.model_validate_json(out)
    saved.write_text(found.model_dump_json())
    return found


def ensure(
    manifest: Manifest,
    image: str,
    *,
    runtime: str = "runc",
    memory: int = 2 * 1024**3,
    cpus: float = 2.0,
    pids: int = 512,
    timeout: float = 900.0,
) -> Layer:
    """The layer for ``manifest`` on ``image``: reused when present, else built (network off)."""
    from docker import errors

    from hybrid.workstation.docker import (
        LABEL_KIND,
        LABEL_MANAGED,
        LABEL_OWNER,
        client,
        seccomp,
        translate,
    )
    from hybrid.workstation.docker.labels import DEFAULT_USER, _owner

    api = client().api
    with translate(f"inspect {image}"):
        image_id = api.inspect_image(image)["Id"]
    key = key_of(image_id, manifest)
    ref = f"{REPOSITORY}:{key[:32]}"
    with translate("find a dependency layer"), contextlib.suppress(errors.ImageNotFound):
        api.inspect_image(ref)
        _touch(key, manifest)
        return _layer(key, ref, image_id, manifest, hit=True)
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix="build-", dir=cache_dir("deps", "staging")))
    builder = None
    try:
        _stage(manifest, staging)
        with translate("build a dependency layer"):
            builder = api.create_container(
                image,
                command=["/bin/sh", f"{_STAGE}/install.sh"],
                user=DEFAULT_USER,
                working_dir="/tmp",
                environment={
                    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
                },
                labels={LABEL_MANAGED: "1", LABEL_KIND: "deps-builder", LABEL_OWNER: _owner()},
                network_disabled=True,
                host_config=api.create_host_config(
                    runtime=runtime,
                    network_mode="none",
                    cap_drop=["ALL"],
                    security_opt=seccomp.security_opt(),
                    pids_limit=pids,
                    mem_limit=memory,
                    memswap_limit=memory,
                    nano_cpus=int(cpus * 1e9),
                    tmpfs={"/tmp": f"rw,nosuid,nodev,size={min(memory, 1024**3)},mode=1777"},
                    binds={str(staging): {"bind": _STAGE, "mode": "ro"}},
                ),
            )["Id"]
            node = any(a.ecosystem == "node" for a in manifest.artifacts)
            api.put_archive(builder, "/", _prefix_archive(node))
            api.start(builder)
            try:
                status = api.wait(builder, timeout=timeout)
            except Exception as exc:
                if (
                    "timed out" not in str(exc).lower()
                    and "timeout" not in type(exc).__name__.lower()
                ):
                    raise
                raise DependencyError(
                    f"installing the dependencies took over {timeout:g}s; refused"
                ) from None
            if status.get("StatusCode") != 0:
                logs = api.logs(builder, stdout=True, stderr=True).decode("utf-8", "replace")
                tail = " / ".join(line.strip() for line in logs.strip().splitlines()[-4:])
                raise DependencyError(
                    f"installing the dependencies inside the sandbox failed "
                    f"(exit {status.get('StatusCode')}): {tail}"
                )
            api.commit(
                builder,
                repository=REPOSITORY,
                tag=key[:32],
                conf={
                    "Cmd": ["sleep", "infinity"],
                    "User": DEFAULT_USER,
                    "WorkingDir": "/workspace",
                    "Labels": {
                        LABEL_MANAGED: "1",
                        LABEL_KIND: KIND,
                        LABEL_KEY: key,
                        LABEL_IMAGE: image_id,
                    },
                },
            )
    finally:
        if builder is not None:
            with contextlib.suppress(errors.DockerException):
                api.remove_container(builder, force=True)
        shutil.rmtree(staging, ignore_errors=True)
    _touch(key, manifest)
    layer = _layer(key, ref, image_id, manifest, hit=False)
    layer.seconds = time.monotonic() - started
    return layer


def _stage(manifest: Manifest, staging: Path) -> None:
    python = [a for a in manifest.artifacts if a.ecosystem == "python"]
    node = [a for a in manifest.artifacts if a.ecosystem == "node" and a.version]
    project = [a for a in manifest.artifacts if a.ecosystem == "node" and not a.version]
    for sub in ("python", "node", "node-project"):
        (staging / sub).mkdir()
    store.stage(python, staging / "python")
    store.stage(node, staging / "node")
    for artifact in project:
        store.stage(
            [artifact.model_copy(update={"filename": Path(artifact.filename).name})],
            staging / "node-project",
        )
    if (staging / "node-project" / "package.json").is_file():
        _without_root_scripts(staging / "node-project" / "package.json")
    for artifact in project:  # once package.json is there too (a v1 lockfile's root entry)
        if Path(artifact.filename).name in ("package-lock.json", "npm-shrinkwrap.json"):
            _point_at_stage(staging / "node-project" / Path(artifact.filename).name, node)
    (staging / "python.txt").write_text("".join(f"{a.name}=={a.version}\n" for a in python))
    (staging / "node.txt").write_text(
        "".join(f"{a.name}@{a.version}\n" for a in node) if project else ""
    )
    (staging / "project.txt").write_text(
        f"{manifest.project} {manifest.version or ''}\n"
        if manifest.project and manifest.paths
        else ""
    )
    points = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    points.optionxform = str  # type: ignore[assignment,method-assign]  # names keep their case
    points.read_dict(manifest.entry_points if manifest.project and manifest.paths else {})
    with (staging / "entry_points.txt").open("w") as out:
        points.write(out)
    (staging / "paths.txt").write_text(
        "".join(
            f"{Path('/workspace', p).as_posix().rstrip('.').rstrip('/') or '/workspace'}\n"
            for p in manifest.paths
        )
    )
    (staging / "install.sh").write_text(_SCRIPT.format(stage=_STAGE, venv=VENV, node=NODE))
    for path in staging.rglob("*"):
        path.chmod(0o555 if path.is_dir() else 0o444)
    staging.chmod(0o555)


_ROOT_LIFECYCLE = (
    "preinstall",
    "install",
    "postinstall",
    "prepublish",
    "preprepare",
    "prepare",
    "postprepare",
)


def _without_root_scripts(package_json: Path) -> None:
    """The project's own install scripts left out of its staged package.json.

    ``npm ci`` runs them in the install directory, which holds only package.json and the
    lockfile, never the project: minimatch's ``prepare`` (tshy, a build of its src/) failed
    there and the whole install with it. The dependencies' own install scripts still run.
    """
    data = json.loads(package_json.read_text(encoding="utf-8"))
    scripts = data.get("scripts")
    if not isinstance(scripts, dict) or not any(k in scripts for k in _ROOT_LIFECYCLE):
        return
    data["scripts"] = {k: v for k, v in scripts.items() if k not in _ROOT_LIFECYCLE}
    package_json.chmod(0o644)
    package_json.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _point_at_stage(lockfile: Path, node: list[Artifact]) -> None:
    """Each locked package resolved from its admitted tarball (``file:``), integrity kept.

    npm then installs from the staged files alone: no registry, no cache, and npm still
    checks every tarball against the lockfile's integrity. (A lockfile without ``resolved``
    fields -- npm's omit-lockfile-registry-resolved -- would otherwise send npm to the registry
    for each package's metadata.)
    """
    files = {(a.name, a.version): a.filename for a in node}
    manifest = json.loads((lockfile.parent / "package.json").read_text(encoding="utf-8"))
    original = json.loads(lockfile.read_text(encoding="utf-8"))
    data = npm_lock.upgraded(original, manifest)
    converted = data is not original  # a v1 tree: what npm would read from the tarballs
    for where, entry in (data.get("packages") or {}).items():
        if not where or not isinstance(entry, dict) or entry.get("link"):
            continue
        name = entry.get("name") or where.rsplit("node_modules/", 1)[-1]
        filename = files.get((str(name), str(entry.get("version"))))
        if filename:
            entry["resolved"] = f"file:{_STAGE}/node/{filename}"
            if converted:
                entry.update(npm_lock.tarball_details(lockfile.parent.parent / "node" / filename))
    data.pop("dependencies", None)  # the v1 tree: "packages" is what npm 7+ installs from
    lockfile.chmod(0o644)
    lockfile.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _prefix_archive(node: bool) -> bytes:
    # /opt/hybrid owned by the workstation user, made before start: the install runs unprivileged.
    # Node looks for node_modules in every parent of the workspace, / included: /node_modules
    # leads to the installed tree, so require() and import find it without a file in the workspace.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(PREFIX.lstrip("/"))
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        info.uid, info.gid = jobuser.JOB_UID, jobuser.JOB_GID
        info.mtime = int(time.time())
        tar.addfile(info)
        if node:
            link = tarfile.TarInfo("node_modules")
            link.type = tarfile.SYMTYPE
            link.linkname = f"{NODE}/node_modules"
            link.mtime = int(time.time())
            tar.addfile(link)
    return buf.getvalue()


def _touch(key: str, manifest: Manifest) -> None:
    record = _record(key)
    if not record.exists():
        tmp = record.with_suffix(".tmp")
        tmp.write_text(manifest.model_dump_json(indent=1))
        os.replace(tmp, record)
    os.utime(record)


def _layer(key: str, ref: str, image_id: str, manifest: Manifest, *, hit: bool) -> Layer:
    return Layer(
        key=key,
        ref=ref,
        image=image_id,
        project=manifest.project,
        artifacts=len(manifest.artifacts),
        last_used=time.time(),
        hit=hit,
    )


def list_layers() -> list[Layer]:
    """Every dependency layer the engine holds, least recently used first."""
    from hybrid.workstation.docker import LABEL_KIND, LABEL_MANAGED, client, translate

    api = client().api
    found = []
    with translate("list dependency layers"):
        for row in api.images(filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}={KIND}"]}):
            labels = row.get("Labels") or {}
            key = labels.get(LABEL_KEY, "")
            tags = [t for t in row.get("RepoTags") or [] if t.startswith(f"{REPOSITORY}:")]
            base_size = 0
            with contextlib.suppress(Exception):
                base_size = int(api.inspect_image(labels.get(LABEL_IMAGE, ""))["Size"])
            record = _record(key) if key else None
            manifest = manifest_of(key) if key else None
            found.append(
                Layer(
                    key=key,
                    ref=tags[0] if tags else row["Id"],
                    image=labels.get(LABEL_IMAGE, ""),
                    project=manifest.project if manifest else None,
                    size_bytes=max(int(row.get("Size", 0)) - base_size, 0),
                    artifacts=len(manifest.artifacts) if manifest else 0,
                    last_used=record.stat().st_mtime if record and record.exists() else 0.0,
                )
            )
    return sorted(found, key=lambda layer: layer.last_used)


class PruneReport(BaseModel):
    """What ``hybrid cache prune`` removed."""

    layers: list[str] = Field(default_factory=list)
    freed_bytes: int = 0
    store_freed_bytes: int = 0
    kept_in_use: list[str] = Field(default_factory=list)


def recorded_keys() -> set[str]:
    """Keys of the layers this cache directory built (its records)."""
    return {path.stem for path in cache_dir("deps", "layers").glob("*.json")}


def prune(
    max_bytes: int = 0, *, keep: set[str] | None = None, only: set[str] | None = None
) -> PruneReport:
    """Evict least-recently-used layers (of ``only``'s keys, when given) until they total
    ``max_bytes`` or less (0: all unused), then the stored artifacts no remaining layer or
    lock needs. Layers a container uses stay."""
    from docker import errors

    from hybrid.workstation.docker import client, translate

    api = client().api
    report = PruneReport()
    keep = keep or set()
    with translate("prune dependency layers"):
        used = {row.get("ImageID") for row in api.containers(all=True)}
        found = [layer for layer in list_layers() if only is None or layer.key in only]
        total = sum(layer.size_bytes for layer in found)
        for layer in found:
            if total <= max_bytes:
                break
            image_id = api.inspect_image(layer.ref)["Id"]
            if image_id in used or layer.key in keep:
                report.kept_in_use.append(layer.ref)
                continue
            with contextlib.suppress(errors.APIError):
                api.remove_image(layer.ref)
                total -= layer.size_bytes
                report.freed_bytes += layer.size_bytes
                report.layers.append(layer.ref)
                with contextlib.suppress(FileNotFoundError):
                    _record(layer.key).unlink()
    report.store_freed_bytes = store.remove_unused(_needed())
    return report


def _needed() -> set[str]:
    needed: set[str] = set()
    for folder in ("layers", "locks"):
        for path in cache_dir("deps", folder).glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                manifest = Manifest.model_validate_json(path.read_text())
                needed |= {a.sha256 for a in manifest.artifacts}
    return needed


def gc(api: Any, report: Any) -> None:
    """Remove layers left untagged (two builds of one key raced) and stale staging directories."""
    from docker import errors

    from hybrid.workstation.docker import LABEL_KIND, LABEL_MANAGED

    used = {row.get("ImageID") for row in api.containers(all=True)}
    for row in api.images(
        all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}={KIND}"]}
    ):
        tags = [t for t in row.get("RepoTags") or [] if t != "<none>:<none>"]
        if not tags and row["Id"] not in used:
            with contextlib.suppress(errors.APIError):
                api.remove_image(row["Id"], force=True)
                report.images.append(row["Id"][7:19])
    cutoff = time.time() - 3600
    for path in cache_dir("deps", "staging").glob("build-*"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < cutoff:
                for sub in path.rglob("*"):
                    with contextlib.suppress(OSError):
                        os.chmod(sub, 0o755 if sub.is_dir() else 0o644)
                os.chmod(path, 0o755)
                shutil.rmtree(path, ignore_errors=True)


def sizes() -> dict[str, Any]:
    """Bytes the store and the layers hold."""
    found = list_layers()
    return {
        "store_bytes": store.size(),
        "layers_bytes": sum(layer.size_bytes for layer in found),
        "layers": [json.loads(layer.model_dump_json()) for layer in found],
    }
