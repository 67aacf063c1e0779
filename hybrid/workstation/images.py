"""Workstation images without a registry: debootstrap a Debian base and ``docker import`` it.

The mirror comes from this machine's own apt sources (never a hard-coded host), so the build
works wherever ``apt-get`` does. A user who has a registry names any image instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from hybrid.errors import EngineUnavailable, InvalidInput, WorkstationError
from hybrid.workstation.jobuser import JOB_GID, JOB_UID

BASE_IMAGE = os.environ.get("HYBRID_BASE_IMAGE", "hybrid/base:bookworm")
# What a workstation needs to build and test a Python project: the interpreter, venv + pip for
# dependencies, pytest, git (for diffs), procps (so a person in `ws shell` can see processes).
PACKAGES = (
    "python3",
    "python3-venv",
    "python3-pip",
    "python3-pytest",
    "git",
    "procps",
    "ca-certificates",
)
PROFILES: dict[str, tuple[str, ...]] = {
    "python": PACKAGES,
    # Node projects: npm installs a lockfile's packages offline inside (hybrid.deps).
    "node": (*PACKAGES, "nodejs", "npm"),
    # Packages that compile (sdists with C extensions) build inside the sandbox.
    "build": (*PACKAGES, "build-essential", "python3-dev", "pkg-config", "nodejs", "npm"),
}
"""Package sets of ``hybrid image bootstrap --profile``, all from Debian."""


def profile_tag(profile: str, suite: str | None = None) -> str:
    """The default tag of a profile's image: the base image for python, ``-PROFILE`` otherwise.

    Another Debian ``suite`` (trixie for Python 3.13, forky for 3.14) is its own tag,
    ``hybrid/base:SUITE``, so images of several interpreters live side by side.
    """
    if profile not in PROFILES:
        raise InvalidInput(f"unknown profile {profile!r}: use one of {', '.join(PROFILES)}")
    base = BASE_IMAGE
    if suite and suite != _codename():
        base = f"{BASE_IMAGE.rsplit(':', 1)[0]}:{suite}"
    return base if profile == "python" else f"{base}-{profile}"


AGENT_UID, AGENT_GID = JOB_UID, JOB_GID
"""The image's ``agent`` user: the ids every job runs as (jobuser.py), no host account's."""
_SOURCES_DIRS = (Path("/etc/apt/sources.list.d"), Path("/etc/apt"))
_DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")


class ImageInfo(BaseModel):
    """A workstation image the engine holds."""

    tag: str
    id: str
    size_bytes: int
    created: str = Field(description="Creation time as the engine reports it.")
    built: bool = Field(
        False, description="True when this call built it; False when it was already present."
    )


def _codename() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "bookworm"


def find_mirror(suite: str | None = None) -> str:
    """The Debian mirror URI this machine's apt sources use for ``suite`` (default: its release).

    A suite no source names (trixie on a bookworm machine) comes from the mirror of the
    machine's own release: a Debian archive serves every suite.
    """
    release = _codename()
    suite = suite or release
    found = _configured_mirror(suite)
    if found is None and suite != release:
        found = _configured_mirror(release)
    if found is None:
        raise EngineUnavailable(
            f"no apt source for suite {suite!r} in /etc/apt/sources.list(.d); "
            "pass --mirror URI (a Debian mirror reachable from here)"
        )
    return found


def _configured_mirror(suite: str) -> str | None:
    candidates: list[Path] = []
    for directory in _SOURCES_DIRS:
        if directory.is_dir():
            candidates += sorted(directory.glob("*.sources")) + sorted(directory.glob("*.list"))
    for path in candidates:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        found = (
            _deb822_mirror(text, suite) if path.suffix == ".sources" else _list_mirror(text, suite)
        )
        if found:
            return found.rstrip("/")
    return None


def _deb822_mirror(text: str, suite: str) -> str | None:
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split() and suite in fields.get("suites", "").split():
            uris = fields.get("uris", "").split()
            if uris:
                return uris[0]
    return None


def _list_mirror(text: str, suite: str) -> str | None:
    for line in text.splitlines():
        parts = re.sub(r"\[[^\]]*\]", "", line).split()
        if len(parts) >= 3 and parts[0] == "deb" and parts[2] == suite:
            return parts[1]
    return None


def get(tag: str = BASE_IMAGE) -> ImageInfo | None:
    """The image ``tag`` if the engine has it, else None."""
    from hybrid.workstation import docker as _docker  # the SDK only when the engine is asked

    client = _docker.client()
    with _docker.translate():
        try:
            image = client.images.get(tag)
        except _docker.errors.ImageNotFound:
            return None
    return ImageInfo(
        tag=tag,
        id=image.id,
        size_bytes=image.attrs.get("Size", 0),
        created=image.attrs.get("Created", ""),
    )


def bootstrap(
    tag: str = BASE_IMAGE,
    *,
    mirror: str | None = None,
    suite: str | None = None,
    packages: tuple[str, ...] = PACKAGES,
    force: bool = False,
    on_progress: Callable[[str], None] | None = None,
) -> ImageInfo:
    """Build the base workstation image with debootstrap and import it; reuse it when present."""
    if not force:
        existing = get(tag)
        if existing is not None:
            return existing
    if shutil.which("debootstrap") is None:
        raise EngineUnavailable("debootstrap is not installed; run: apt-get install -y debootstrap")
    if os.geteuid() != 0:
        raise EngineUnavailable("debootstrap needs root; run hybrid image bootstrap as root")
    if ":" not in tag or tag.endswith(":"):
        raise InvalidInput(f"image tag must be NAME:TAG, got {tag!r}")
    suite = suite or _codename()
    mirror = mirror or find_mirror(suite)
    progress = on_progress or (lambda _line: None)
    work = Path(tempfile.mkdtemp(prefix="hybrid-image-"))
    try:
        rootfs = work / "rootfs"
        # debootstrap configures its --include set without a working dpkg around it, which
        # npm's dozens of node-* packages do not survive; the rest goes in with apt afterwards.
        base = [p for p in packages if p in PACKAGES]
        extra = [p for p in packages if p not in PACKAGES]
        command = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(base)}",
            suite,
            str(rootfs),
            mirror,
        ]
        # This machine's debootstrap may predate the suite (bookworm's knows no forky); every
        # Debian release since bullseye bootstraps with the same script as sid.
        if not (_DEBOOTSTRAP_SCRIPTS / suite).exists() and (_DEBOOTSTRAP_SCRIPTS / "sid").exists():
            command.append(str(_DEBOOTSTRAP_SCRIPTS / "sid"))
        progress(f"debootstrap {suite} from {mirror}")
        _stream(command, progress)
        if extra:
            progress(f"apt-get install {' '.join(extra)}")
            _apt_install(rootfs, extra, progress)
        _prepare_rootfs(rootfs)
        progress("packing the root filesystem")
        archive = work / "rootfs.tar"
        subprocess.run(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(archive), "."], check=True
        )
        progress(f"importing as {tag}")
        from hybrid.workstation import docker as _docker

        repository, version = tag.rsplit(":", 1)
        client = _docker.client()
        with _docker.translate():
            client.api.import_image(
                src=str(archive),
                repository=repository,
                tag=version,
                changes=[
                    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "ENV LANG=C.UTF-8",
                    f"USER {AGENT_UID}:{AGENT_GID}",
                    "WORKDIR /workspace",
                    'CMD ["sleep", "infinity"]',
                    f"LABEL {_docker.LABEL_MANAGED}=1 {_docker.LABEL_KIND}=base",
                ],
            )
    except subprocess.CalledProcessError as exc:
        raise WorkstationError(
            f"building the base image failed: {' '.join(map(str, exc.cmd))} exited {exc.returncode}"
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    info = get(tag)
    if info is None:
        raise WorkstationError(f"the engine did not keep the imported image {tag}")
    from hybrid.workstation.bwrap import rootfs as bwrap_root

    bwrap_root.forget(tag)  # the bwrap tier's exported copy is of the old image
    return info.model_copy(update={"built": True})


def _stream(
    command: list[str],
    progress: Callable[[str], None],
    *,
    env: dict[str, str] | None = None,
    what: str = "debootstrap",
) -> None:
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = [*tail[-19:], line]
        progress(line)
    if proc.wait() != 0:
        raise WorkstationError(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def _apt_install(rootfs: Path, packages: list[str], progress: Callable[[str], None]) -> None:
    """Install ``packages`` into ``rootfs`` with its own apt, under this machine's apt settings."""
    parts = Path("/etc/apt/apt.conf.d")
    borrowed = []
    for conf in sorted(parts.glob("*")) if parts.is_dir() else []:
        target = rootfs / "etc/apt/apt.conf.d" / f"zz-host-{conf.name}"
        if conf.is_file():
            shutil.copyfile(conf, target)
            borrowed.append(target)
    proc = rootfs / "proc"
    subprocess.run(["mount", "-t", "proc", "proc", str(proc)], check=True)
    try:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
            ["apt-get", "clean"],
        ):
            _stream(["chroot", str(rootfs), *argv], progress, env=env, what=argv[1])
    finally:
        subprocess.run(["umount", "-l", str(proc)], check=False)
        for target in borrowed:
            target.unlink(missing_ok=True)


def _prepare_rootfs(rootfs: Path) -> None:
    # The non-root user every workstation runs as, and its workspace owned by it.
    with (rootfs / "etc/passwd").open("a") as f:
        f.write(f"agent:x:{AGENT_UID}:{AGENT_GID}:hybrid agent:/tmp:/bin/bash\n")
    with (rootfs / "etc/group").open("a") as f:
        f.write(f"agent:x:{AGENT_GID}:\n")
    workspace = rootfs / "workspace"
    workspace.mkdir(exist_ok=True)
    os.chown(workspace, AGENT_UID, AGENT_GID)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (rootfs / junk).glob("*"):
            if item.is_file():
                item.unlink()
