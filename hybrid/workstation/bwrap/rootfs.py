"""The read-only toolchain root a bwrap sandbox sees.

By default the workstation base image (``hybrid/base:bookworm``, the same toolchain the docker
and gvisor tiers run), exported once from the local Docker engine into the cache directory
(``<workspace.base()>/rootfs-<image id>``, ~300 MB, ~10 s; not the cache directory, which
the sandbox user may not traverse) and bound read-only from then on: no daemon is
involved after that. Binding a prepared directory costs the same per sandbox as binding the
host's /usr, and the image's /etc carries no host secret. Without the engine or the image, the
host's own /usr (with /bin, /lib, ... as the host has them) and an allow-list of /etc files
serve instead (``HOST``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hybrid.errors import EngineUnavailable

HOST = "host"
"""The ``image`` name that asks for the host's own root instead of an exported image."""

TOP = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "var", "opt")
"""What of a root filesystem a sandbox sees (each read-only); everything else is its own."""

HOST_ETC = (
    "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf",
    "ssl", "ca-certificates", "ca-certificates.conf", "mime.types", "protocols", "services",
    "os-release", "debian_version", "python3", "python3.11", "gitconfig", "profile", "bash.bashrc",
    "inputrc", "magic", "login.defs",
)  # fmt: skip
"""The host /etc entries a host-root sandbox sees: what toolchains read, no credentials."""


@dataclass(frozen=True)
class Root:
    """A toolchain root: ``path`` and the image it came from (``HOST`` for the host's own)."""

    path: Path
    image: str

    def entries(self) -> list[tuple[str, str, str]]:
        """(kind, name, target): ("dir", "usr", host path) or ("symlink", "bin", "usr/bin")."""
        found = []
        for name in TOP:
            if self.image == HOST and name == "etc":
                continue
            where = self.path / name
            if where.is_symlink():
                found.append(("symlink", name, os.readlink(where)))
            elif where.is_dir():
                found.append(("dir", name, str(where)))
        if self.image == HOST:
            for name in HOST_ETC:
                where = Path("/etc") / name
                if where.exists():
                    kind = "dir" if where.is_dir() else "file"
                    found.append((kind, f"etc/{name}", str(where.resolve())))
        return found


def find(image: str | None = None) -> Root | None:
    """The prepared root for ``image`` (default: the base image), or None if not exported yet.

    The root last exported for that tag serves without asking the engine (a sandbox start must
    not wait on a daemon); ``hybrid image bootstrap`` forgets it when it rebuilds the image.
    """
    if image == HOST:
        return Root(Path("/"), HOST)
    latest = _home() / _tag_link(image or _base())
    if (latest / "usr").is_dir():
        return Root(latest.resolve(), image or _base())
    image_id = _image_id(image)
    if image_id is None:
        return None
    path = _home() / f"rootfs-{image_id[:12]}"
    return Root(path, image or _base()) if (path / "usr").is_dir() else None


def forget(image: str) -> None:
    """Forget the root exported for tag ``image`` (it was rebuilt): the next use exports again."""
    with contextlib.suppress(FileNotFoundError):
        (_home() / _tag_link(image)).unlink()


def prepare(image: str | None = None) -> Root:
    """The root for ``image``: exported from the engine on first use (once per image id).

    With no image asked for and no engine or base image, the host's own root.
    """
    if image == HOST:
        return Root(Path("/"), HOST)
    found = find(image)
    if found is not None and (_home() / _tag_link(found.image)).exists():
        return found
    image_id = _image_id(image)
    if image_id is None:
        if image is None:
            return Root(Path("/"), HOST)
        raise EngineUnavailable(
            f"image {image} is not in the local Docker engine (the bwrap tier exports its root once)"
        )
    path = _home() / f"rootfs-{image_id[:12]}"
    with open(_home() / ".export.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one export per image, whatever the processes
        if not (path / "usr").is_dir():
            _export(image or _base(), path)
        link = _home() / _tag_link(image or _base())
        fresh = link.with_name(link.name + ".new")
        with contextlib.suppress(FileNotFoundError):
            fresh.unlink()
        fresh.symlink_to(path.name)
        fresh.replace(link)
    return Root(path, image or _base())


def _tag_link(image: str) -> str:
    return "rootfs@" + "".join(c if c.isalnum() or c in "._-" else "_" for c in image)


def _home() -> Path:
    from hybrid.workstation.bwrap.workspace import base

    return base()


def _base() -> str:
    from hybrid.workstation.images import BASE_IMAGE

    return BASE_IMAGE


@functools.cache
def _image_id(image: str | None) -> str | None:
    """The engine's id of ``image`` (the base image by default); None without engine or image."""
    try:
        from hybrid.workstation.docker import client

        found = client().api.inspect_image(image or _base())
    except Exception:  # no SDK, no engine, no image: all mean "not exportable here"
        return None
    return str(found["Id"]).rpartition(":")[2]


def _export(image: str, path: Path) -> None:
    from hybrid.workstation.docker import client

    api = client().api
    made = api.create_container(
        image, command=["true"], labels={"hybrid.managed": "1", "hybrid.kind": "bwrap-rootfs"}
    )
    partial = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        with tempfile.TemporaryFile() as archive:
            for chunk in api.export(made["Id"]):
                archive.write(chunk)
            archive.seek(0)
            with tarfile.open(fileobj=archive) as tar:
                # Ownership and modes as in the image (the sandbox sees it read-only).
                tar.extractall(partial, filter="fully_trusted")
        partial.chmod(0o755)
        partial.rename(path)
    finally:
        with contextlib.suppress(Exception):
            api.remove_container(made["Id"], force=True)
        shutil.rmtree(partial, ignore_errors=True)
