"""Reading a repository on the host: regular files only, never through a link, always bounded.

A repository is hostile input. ``src/shadow.py -> /etc/shadow``, ``settings.py ->
/proc/self/environ``, a tracked ``pkg/`` replaced by ``pkg -> /elsewhere`` or a FIFO named
``x.py`` must not put a host file into a map, a context pack or a model's prompt, nor hang the
reader. Every host-side read of repository content goes through ``read_file``: it walks the
path one component at a time from the root with ``O_NOFOLLOW`` (so no symlink is followed
anywhere below the root), reads only what ``fstat`` says is a regular file, opened
non-blocking, and never more than a cap. ``Tree`` answers the cheaper question of whether a
listed path is such a file (for enumerating thousands), with the reason when it is not.

The root itself is opened as named: the user chose it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hybrid.errors import InvalidInput

MAX_READ_BYTES = 1_000_000
"""The default cap of one read (a context source file is skipped above this size)."""

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in between the check and the open must not hang the reader.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 16

MISSING = "no such file"
"""The reason for a path that does not exist (a deleted file: callers leave it out unnamed)."""


class Refused(InvalidInput):
    """A repository path that is not read: ``reason`` says why (a symlink, a FIFO, too large)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[type[Refused], tuple[str, str]]:
        return type(self), (self.path, self.reason)  # whole again across a process pool


def kind_of(mode: int) -> str | None:
    """Why a file of this mode is not read; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symlink (not followed)"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO, not a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a regular file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a regular file"
    return "not a regular file"


def _parts(rel: str) -> list[str]:
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        raise Refused(rel, "not a plain path inside the repository")
    return parts


def read_file(
    root: str | os.PathLike[str], rel: str, limit: int = MAX_READ_BYTES, *, one_link: bool = False
) -> bytes:
    """The bytes of regular file ``rel`` (a POSIX path relative to ``root``), read without
    following a symlink in any component; more than ``limit`` bytes, a link, a FIFO, a device
    or a missing file raises ``Refused``. ``one_link`` also refuses a hard-linked file (another
    name of a file that may live outside the repository)."""
    parts = _parts(rel)
    try:
        fd = os.open(root, _DIR)
    except OSError as exc:
        raise Refused(rel, f"cannot open the repository: {exc.strerror}") from None
    try:
        for k, part in enumerate(parts[:-1]):
            sub = _enter(fd, part, "/".join(parts[: k + 1]), rel)
            os.close(fd)
            fd = sub
        return _read_regular(fd, parts[-1], rel, limit, one_link)
    finally:
        os.close(fd)


def _enter(dir_fd: int, name: str, so_far: str, rel: str) -> int:
    """Open directory ``name`` below ``dir_fd``, refusing a symlink."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            raise Refused(rel, _parent_reason(so_far, st.st_mode))
        return os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        raise Refused(rel, MISSING) from None
    except OSError as exc:  # ELOOP/ENOTDIR: swapped for a link since the stat
        raise Refused(rel, f"{so_far}: cannot open: {exc.strerror}") from None


def _parent_reason(so_far: str, mode: int) -> str:
    if stat.S_ISLNK(mode):
        return f"its directory {so_far} is a symlink (not followed)"
    return f"{so_far} is not a directory"


def _read_regular(dir_fd: int, name: str, rel: str, limit: int, one_link: bool) -> bytes:
    try:
        # lstat first: a device node is never opened (opening one can act on the device).
        reason = kind_of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        if reason is not None:
            raise Refused(rel, reason)
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except FileNotFoundError:
        raise Refused(rel, MISSING) from None
    except OSError as exc:
        raise Refused(rel, f"unreadable: {exc.strerror}") from None
    try:
        opened = os.fstat(fd)
        reason = kind_of(opened.st_mode)
        if reason is not None:  # swapped since the lstat
            raise Refused(rel, reason)
        if one_link and opened.st_nlink > 1:
            raise Refused(rel, "hard-linked (it may be a file outside the repository)")
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise Refused(rel, f"larger than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise Refused(rel, f"unreadable: {exc.strerror}") from None
    finally:
        os.close(fd)


def read_text(root: str | os.PathLike[str], rel: str, limit: int = MAX_READ_BYTES) -> str:
    """``read_file`` decoded as UTF-8, undecodable bytes replaced."""
    return read_file(root, rel, limit).decode("utf-8", "replace")


class Tree:
    """Which listed paths of one tree are regular files reachable without a symlink.

    ``check`` costs one ``lstat`` per file (each directory is checked once): cheap enough for
    every file of a large checkout. It is a listing, not a guarantee: ``read_file`` checks
    again as it reads.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._dirs: dict[str, str | None] = {"": None}

    def check(self, rel: str) -> tuple[os.stat_result | None, str | None]:
        """``(lstat, None)`` for a regular file, else ``(None, why not)`` (``MISSING`` if gone)."""
        try:
            parts = _parts(rel)
        except Refused as exc:
            return None, exc.reason
        reason = self._dir("/".join(parts[:-1]))
        if reason is not None:
            return None, reason
        try:
            st = os.lstat(self.root / rel)
        except FileNotFoundError:
            return None, MISSING
        except OSError as exc:
            return None, f"unreadable: {exc.strerror}"
        reason = kind_of(st.st_mode)
        return (st, None) if reason is None else (None, reason)

    def _dir(self, rel: str) -> str | None:
        if rel in self._dirs:
            return self._dirs[rel]
        parent, _, _ = rel.rpartition("/")
        reason = self._dir(parent)
        if reason is None:
            try:
                mode = os.lstat(self.root / rel).st_mode
                reason = None if stat.S_ISDIR(mode) else _parent_reason(rel, mode)
            except FileNotFoundError:
                reason = MISSING
            except OSError as exc:
                reason = f"{rel}: unreadable: {exc.strerror}"
        self._dirs[rel] = reason
        return reason


__all__ = ["MAX_READ_BYTES", "MISSING", "Refused", "Tree", "kind_of", "read_file", "read_text"]
