"""Reading a repository's declaration files on the host: regular files inside it, never via a link.

A repository is hostile input here: a committed ``setup.cfg -> /proc/self/environ`` or
``requirements.txt -> /etc/shadow`` survives ``git clone``, and a ``-r ../x.txt`` include names a
file outside it. So a path is taken relative to the repository, checked lexically (no absolute
path, no ``..`` out of it), and walked one component at a time from the repository's own
directory with ``O_NOFOLLOW``: a symbolic link anywhere on the way, a FIFO, a device, a directory
or a hard-linked file (another name of a file that may live outside) is refused, and a read is
bounded. Errors name the path, never the bytes.

The reading itself is ``hybrid.repofs``'s, as for context; this module adds the lexical rules
of an include, refuses hard links, and lists and classifies paths without following links.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
from collections.abc import Iterator
from pathlib import Path

from hybrid import repofs
from hybrid.paths import display

MAX_BYTES = 32 * 1024 * 1024
"""The largest declaration read (a big package-lock.json is a few MB)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def shown(text: str | os.PathLike[str]) -> str:
    """A repository-supplied name for a one-line message: control characters escaped, bounded."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in display(text))
    return out if len(out) <= 200 else out[:200] + "..."


class Unreadable(Exception):
    """A declaration path that is not read; ``str()`` says why, naming the path only."""


def inside(rel: str) -> str:
    """``rel`` normalized as a path inside the repository (Unreadable when it leaves it)."""
    if "\0" in rel or not rel.strip():
        raise Unreadable(f"{shown(rel)!r} is not a path")
    if rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        raise Unreadable(f"{shown(rel)} is outside the repository (an absolute path)")
    norm = posixpath.normpath(rel.replace("\\", "/"))
    if norm == ".." or norm.startswith("../"):
        raise Unreadable(f"{shown(rel)} is outside the repository")
    return norm


def read(repo: Path, rel: str, *, limit: int = MAX_BYTES) -> bytes | None:
    """The bytes of ``repo/rel``, or None when nothing is there; Unreadable when it is anything
    but a regular file reached inside ``repo`` without following a link, or is hard-linked."""
    rel = inside(rel)
    if rel == ".":
        raise Unreadable(f"{shown(rel)} is a directory")
    try:
        return repofs.read_file(repo, rel, limit, one_link=True)
    except repofs.Refused as exc:
        if exc.reason == repofs.MISSING:
            return None
        raise Unreadable(f"{shown(rel)}: {exc.reason}") from None


def kind(repo: Path, rel: str) -> str | None:
    """What ``repo/rel`` is without following a link: "file", "dir", "link", "other" or None."""
    rel = inside(rel)
    parts = rel.split("/")
    try:
        with _walk(repo, parts[:-1], rel) as parent:
            if parent is None:
                return None
            info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except (Unreadable, OSError):
        return "other"
    if stat.S_ISLNK(info.st_mode):
        return "link"
    if stat.S_ISDIR(info.st_mode):
        return "dir"
    return "file" if stat.S_ISREG(info.st_mode) else "other"


def names(repo: Path, rel: str = ".") -> list[str]:
    """The entry names of the directory ``repo/rel`` (reached without a link), sorted."""
    rel = inside(rel)
    parts = [] if rel == "." else rel.split("/")
    with _walk(repo, parts, rel) as found:
        if found is None:
            return []
        return sorted(os.listdir(found))


@contextlib.contextmanager
def _walk(repo: Path, parts: list[str], rel: str) -> Iterator[int | None]:
    """An fd of the directory ``repo/parts...`` opened component by component, never through a
    link (None when a component is missing)."""
    try:
        fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Unreadable(f"{shown(repo)}: cannot open the repository: {exc.strerror}") from None
    try:
        for part in parts:
            if part in ("", "."):
                continue
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                os.close(fd)
                fd = -1
                yield None
                return
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Unreadable(
                        f"{shown(rel)} is reached through a symbolic link or a non-directory"
                    ) from None
                raise Unreadable(f"{shown(rel)}: cannot read: {exc.strerror}") from None
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        if fd >= 0:
            os.close(fd)
