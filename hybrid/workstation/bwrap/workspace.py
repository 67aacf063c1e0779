"""The workspace of a bwrap workstation: a size-capped tmpfs on the host, and safe file access.

A loop-mounted ext4 image (what the docker tier uses, disk.py) costs ~100 ms to format, mount
and unmount here, three times this tier's whole create + exec + remove budget; a tmpfs mounted
with ``size=budget.disk`` costs well under a millisecond and fails writes past the cap with
ENOSPC just the same. Its files live in memory (and swap): what a command writes there counts
against its memory cgroup, and a persistent workstation's files do not survive a host reboot.

The sandbox owns everything under the workspace and may plant symlinks anywhere in it, so the
host never resolves a path there by name: every step is opened relative to a directory
descriptor with O_NOFOLLOW (``open_dir``), and trees are read with ``archive.walk``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
import stat
import tarfile
from collections.abc import Generator, Iterator
from pathlib import Path, PurePosixPath
from typing import IO

from hybrid.errors import EngineUnavailable, InvalidInput, WorkstationError
from hybrid.workstation import archive

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 32, 4096, 16384
_MNT_DETACH = 2
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def base() -> Path:
    """Where workspaces, staged mounts and toolchain roots live: a root-owned tree every step of
    which the sandbox user may traverse (mode 0711), because bwrap, run as that user, resolves
    each path it binds (even one given as a descriptor). Under it, names are unguessable ids."""
    where = Path(os.environ.get("HYBRID_BWRAP_DIR", "/var/lib/hybrid-bwrap"))
    for path in (where, where / "ws"):
        if not path.is_dir():
            path.mkdir(mode=0o711, parents=True, exist_ok=True)
            path.chmod(0o711)
    return where


def bind(source: Path, where: Path, writable: bool) -> None:
    """Bind host ``source`` on ``where`` (made here), read-only unless ``writable``."""
    where.mkdir(mode=0o755)
    flags = _MS_BIND | _MS_REC
    if _libc.mount(os.fsencode(source), os.fsencode(where), None, flags, None) != 0:
        code = ctypes.get_errno()
        where.rmdir()
        raise InvalidInput(f"mount {source}: {os.strerror(code)}")
    if not writable:
        flags = _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
        if _libc.mount(None, os.fsencode(where), None, flags, None) != 0:
            code = ctypes.get_errno()
            unmount(where)
            where.rmdir()
            raise WorkstationError(f"mount {source} read-only: {os.strerror(code)}")


def mount(where: Path, size: int, uid: int, gid: int) -> None:
    """Mount a tmpfs of ``size`` bytes on ``where`` (nosuid, nodev), its root owned by uid:gid."""
    if os.geteuid() != 0:
        raise EngineUnavailable(
            "a size-capped bwrap workspace needs root (it mounts a sized tmpfs on the host)"
        )
    inodes = max(size // 4096, 4096)
    options = f"size={size},nr_inodes={inodes},mode=0755,uid={uid},gid={gid}".encode()
    if _libc.mount(b"tmpfs", os.fsencode(where), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
        code = ctypes.get_errno()
        raise WorkstationError(f"mounting the workspace on {where}: {os.strerror(code)}")


def unmount(where: Path) -> None:
    """Unmount it (lazily if busy) and remove the mount point; idempotent."""
    # Unconditionally: os.path.ismount cannot see a bind mount from the same filesystem, and
    # umount2 on a directory that is no mount point just fails with EINVAL.
    _libc.umount2(os.fsencode(where), _MNT_DETACH)
    with contextlib.suppress(OSError):
        where.rmdir()


def is_mounted(where: Path) -> bool:
    return os.path.ismount(where)


def relative(workspace: str, path: str) -> PurePosixPath:
    """``path`` (relative to, or inside, the workspace) as a path relative to it."""
    root = PurePosixPath(workspace)
    inside = PurePosixPath(path) if path.startswith("/") else root / path
    try:
        rel = inside.relative_to(root)
    except ValueError:
        raise InvalidInput(f"{path}: files go into the workspace {workspace}") from None
    if ".." in rel.parts:
        raise InvalidInput(f"{path}: must not contain '..'")
    return rel


def open_dir(top: Path, parts: tuple[str, ...], owner: tuple[int, int] | None = None) -> int:
    """A descriptor of directory ``top/parts`` reached without following any symlink;
    ``owner``: create missing directories, owned by it. InvalidInput if a step is not a
    directory (a symlink planted there included)."""
    fd = os.open(top, _DIR)
    try:
        for part in parts:
            if owner is not None:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
            try:
                step = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                raise WorkstationError(f"{part}: no such directory in the workspace") from None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise InvalidInput(
                        f"{part}: not a directory (a symlink is not followed)"
                    ) from None
                raise
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_bytes(dir_fd: int, name: str, data: bytes, owner: tuple[int, int]) -> None:
    try:
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidInput(
                f"{name}: is a symlink in the workspace; not written through"
            ) from None
        if exc.errno == errno.ENOSPC:
            raise WorkstationError(f"{name}: the workspace is full") from None
        raise
    try:
        os.fchown(fd, *owner)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def copy_tree(source: Path, dir_fd: int, name: str, owner: tuple[int, int]) -> None:
    """Copy host ``source`` (a file or directory; symlinks in it are copied, never followed) to
    ``name`` in directory ``dir_fd``."""
    fds: dict[str, int] = {}
    try:
        for entry in archive.walk(source, archive.Everything()):
            rel = PurePosixPath(name, entry.path) if entry.path else PurePosixPath(name)
            parent = fds.get(str(rel.parent), dir_fd)
            leaf = rel.name
            if entry.kind == "dir":
                with contextlib.suppress(FileExistsError):
                    os.mkdir(leaf, 0o755, dir_fd=parent)
                    os.chown(leaf, *owner, dir_fd=parent, follow_symlinks=False)
                fds[str(rel)] = open_dir_at(parent, leaf)
            elif entry.kind == "symlink":
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISLNK(os.stat(leaf, dir_fd=parent, follow_symlinks=False).st_mode):
                        os.unlink(leaf, dir_fd=parent)
                os.symlink(entry.target, leaf, dir_fd=parent)
                os.chown(leaf, *owner, dir_fd=parent, follow_symlinks=False)
            else:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
                try:
                    out = os.open(leaf, flags, entry.mode & 0o777, dir_fd=parent)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        raise InvalidInput(f"{rel}: is a symlink in the workspace") from None
                    raise
                try:
                    os.fchown(out, *owner)
                    os.fchmod(out, entry.mode & 0o777)
                    os.lseek(entry.fd, 0, os.SEEK_SET)
                    while os.sendfile(out, entry.fd, None, 1 << 24):
                        pass
                finally:
                    os.close(out)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise WorkstationError(f"copying {source} in: the workspace is full") from None
        raise WorkstationError(f"copying {source} in: {exc.strerror}") from None
    finally:
        for fd in fds.values():
            os.close(fd)


def open_dir_at(parent: int, name: str) -> int:
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise InvalidInput(f"{name}: not a directory (a symlink is not followed)") from None
        raise


def entries(dir_fd: int, name: str) -> Generator[archive.HostEntry, None, None]:
    """``name`` in ``dir_fd`` and everything under it, read without following a symlink."""
    return archive.walk(Path(f"/proc/self/fd/{dir_fd}/{name}"), archive.Everything(), False)


def tar_of(items: Iterator[archive.HostEntry], name: str, out: IO[bytes]) -> None:
    """Write ``items`` as a tar under ``name``, symlinks climbing out of it included."""
    with tarfile.open(fileobj=out, mode="w") as tar:
        for later in archive.pack(tar, items, name, (0, 0)):
            info = tarfile.TarInfo(later.path)
            info.type, info.linkname = tarfile.SYMTYPE, later.target
            tar.addfile(info)
    out.seek(0)


def drop(home: Path, mounts: list[str]) -> None:
    """Unmount the workspace and staged mounts (``mounts``) and delete ``home`` (idempotent)."""
    for path in mounts:
        unmount(Path(path))
    shutil.rmtree(home, ignore_errors=True)
