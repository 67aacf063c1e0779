"""Tar archives between the host and a sandbox, without ever following a symlink.

Into the sandbox: host files are read through directory file descriptors opened with
O_NOFOLLOW, so a symlink anywhere in a repository (``s -> /etc`` replacing a tracked ``s/``,
``link -> /etc/shadow``) is carried as a symlink and the host's target is never read. Every
directory travels as its own entry ahead of its contents: the engine's extraction replaces a
symlink the sandbox planted at that path with a real directory instead of writing through it.

Out of the sandbox: an archive is checked member by member before anything is written; a member
that is absolute, climbs out with ``..`` or is a link resolving outside the destination is one
``InvalidInput`` line, and nothing is extracted.
"""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Protocol

from hybrid import git
from hybrid.errors import InvalidInput, WorkstationError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a fifo swapped in after the lstat must not hang the copy.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20
_MAX_LINK_DEPTH = 40
_LS_FILES = ["ls-files", "-z", "--cached", "--others", "--exclude-standard"]


@dataclass
class HostEntry:
    """One thing to copy in: a directory, a regular file (open, as ``fd``) or a symlink."""

    path: str
    kind: str  # "dir" | "file" | "symlink"
    mode: int = 0o755
    mtime: float = 0.0
    size: int = 0
    target: str = ""
    fd: int = -1


class Selection(Protocol):
    """Which paths under a root to copy (relative POSIX paths, "" is the root)."""

    def take(self, path: str, is_dir: bool) -> bool: ...

    def descend(self, path: str) -> bool: ...


class Everything:
    """Every file, symlink and directory."""

    def take(self, path: str, is_dir: bool) -> bool:
        return True

    def descend(self, path: str) -> bool:
        return True


class Listed:
    """The paths git lists (tracked + untracked, not ignored), their parents and all of .git."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = set(paths)
        self.parents = {str(p) for path in paths for p in PurePosixPath(path).parents} - {"."}
        self.parents.add(".git")

    def _in_git(self, path: str) -> bool:
        return path == ".git" or path.startswith(".git/")

    def take(self, path: str, is_dir: bool) -> bool:
        return path in self.paths or self._in_git(path) or (is_dir and path in self.parents)

    def descend(self, path: str) -> bool:
        # A listed directory without listed contents is a nested repository: only its
        # directory goes in, as before.
        return path in self.parents or self._in_git(path)


def repo_selection(repo: Path) -> Selection:
    """What to copy from ``repo``: git's listing when it is a work tree, else everything."""
    try:
        dot_git = os.lstat(repo / ".git")
    except OSError:
        return Everything()
    if stat.S_ISLNK(dot_git.st_mode):
        return Everything()  # git would follow it; the link itself is carried instead
    try:
        # The repository's own config must not run anything on the host (core.fsmonitor).
        listed = git.run(_LS_FILES, repo, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return Everything()
    paths = [os.fsdecode(p).rstrip("/") for p in listed.split(b"\0") if p and p.rstrip(b"/")]
    return Listed(paths)


def walk(
    root: Path, select: Selection, follow_root: bool = True
) -> Generator[HostEntry, None, None]:
    """Entries under ``root`` (parents first), never reading through a symlink below it.

    ``root`` itself is opened as named when ``follow_root`` (a user's path to a repository);
    otherwise a symlink there is yielded as one. A file's ``fd`` is closed once the consumer
    moves on.
    """
    st = os.stat(root) if follow_root else os.lstat(root)
    if stat.S_ISLNK(st.st_mode):
        yield HostEntry("", "symlink", 0o777, st.st_mtime, target=os.readlink(root))
        return
    if stat.S_ISREG(st.st_mode):
        fd = os.open(root, _FILE_FLAGS if not follow_root else _FILE_FLAGS & ~os.O_NOFOLLOW)
        try:
            yield _file_entry("", fd)
        finally:
            os.close(fd)
        return
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidInput(f"{root}: not a regular file, directory or symlink")
    fd = os.open(root, _DIR_FLAGS if not follow_root else _DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        yield HostEntry("", "dir", stat.S_IMODE(st.st_mode), st.st_mtime)
        yield from _walk_dir(fd, "", select)
    finally:
        os.close(fd)


def _walk_dir(dir_fd: int, prefix: str, select: Selection) -> Iterator[HostEntry]:
    with os.scandir(dir_fd) as scan:
        names = sorted((e.name for e in scan), key=os.fsencode)
    for name in names:
        rel = prefix + name
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # gone since the listing
        if stat.S_ISDIR(st.st_mode):
            if not select.take(rel, True):
                continue
            yield HostEntry(rel, "dir", stat.S_IMODE(st.st_mode), st.st_mtime)
            if select.descend(rel):
                sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                try:
                    yield from _walk_dir(sub, rel + "/", select)
                finally:
                    os.close(sub)
        elif stat.S_ISLNK(st.st_mode) and select.take(rel, False):
            target = os.readlink(name, dir_fd=dir_fd)
            yield HostEntry(rel, "symlink", 0o777, st.st_mtime, target=target)
        elif stat.S_ISREG(st.st_mode) and select.take(rel, False):
            try:
                fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                raise InvalidInput(f"{rel}: cannot read: {exc.strerror}") from None
            try:
                yield _file_entry(rel, fd)
            finally:
                os.close(fd)
        # sockets, fifos and devices stay on the host


def _file_entry(rel: str, fd: int) -> HostEntry:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(f"{rel or 'source'}: changed into a non-regular file while copying")
    return HostEntry(rel, "file", stat.S_IMODE(st.st_mode), st.st_mtime, st.st_size, fd=fd)


class BlobSink(Protocol):
    """Receives a file's exact bytes as they go into the archive (the baseline recorder)."""

    def file(self, path: str, executable: bool, size: int) -> Callable[[bytes], None]: ...

    def symlink(self, path: str, target: str) -> None: ...


def pack(
    tar: tarfile.TarFile,
    entries: Iterator[HostEntry],
    name: str,
    owner: tuple[int, int],
    sink: BlobSink | None = None,
) -> list[HostEntry]:
    """Add ``entries`` under archive path ``name`` ("" for the top) owned by ``owner``.

    Every byte read goes both into the archive and to ``sink``, so a baseline records exactly
    what went in. The engine refuses a relative symlink that climbs above the directory it
    extracts into, so those are left out of the archive and returned (archive path, target)
    for the caller to make inside.
    """
    later = []
    try:
        for entry in entries:
            arcname = "/".join(part for part in (name, entry.path) if part)
            if not arcname:
                continue  # the destination directory itself
            info = tarfile.TarInfo(arcname)
            info.uid, info.gid = owner
            info.mtime = int(entry.mtime)
            info.mode = entry.mode & 0o777  # no setuid, setgid or sticky bits travel
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "symlink":
                if sink is not None:
                    sink.symlink(arcname, entry.target)
                if escapes(arcname, entry.target):
                    later.append(HostEntry(arcname, "symlink", target=entry.target))
                    continue
                info.type = tarfile.SYMTYPE
                info.linkname = entry.target
                tar.addfile(info)
            else:
                info.size = entry.size
                feed = sink.file(arcname, bool(entry.mode & 0o100), entry.size) if sink else None
                try:
                    tar.addfile(info, _Reader(entry.fd, feed))
                except OSError as exc:
                    raise InvalidInput(f"{arcname}: changed while copying ({exc})") from None
    except OSError as exc:
        raise InvalidInput(f"{exc.filename or name}: cannot read: {exc.strerror}") from None
    return later


class _Reader(io.RawIOBase):
    """Reads an fd for tarfile (which wants full reads) and tees each chunk to ``feed``."""

    def __init__(self, fd: int, feed: Callable[[bytes], None] | None) -> None:
        self._file = os.fdopen(fd, "rb", closefd=False)
        self._feed = feed

    def read(self, n: int = -1) -> bytes:
        data = self._file.read(n)
        if self._feed is not None and data:
            self._feed(data)
        return data


def escapes(name: str, target: str) -> bool:
    """Whether a relative symlink at archive path ``name`` points above the archive's top."""
    if target.startswith("/"):
        return False
    depth = len(PurePosixPath(name).parts) - 1
    for part in PurePosixPath(target).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part != ".":
            depth += 1
    return False


# -- out of a sandbox ----------------------------------------------------------------------


def extract(archive: IO[bytes], dest: Path, what: str) -> None:
    """Check every member of ``archive``, then extract it under ``dest`` (nothing on refusal)."""
    try:
        with tarfile.open(fileobj=archive, mode="r:") as tar:
            members = _checked(tar.getmembers(), what)
            dest.mkdir(parents=True, exist_ok=True)
            # The data filter re-checks on disk (a symlink already in ``dest`` is the user's own).
            tar.extractall(dest, members=members, filter="data")
    except tarfile.TarError as exc:
        raise InvalidInput(f"{what}: refused to write it to {dest}: {exc}") from None
    except OSError as exc:
        raise WorkstationError(f"{what}: writing to {dest} failed: {exc.strerror or exc}") from None


def _checked(members: list[tarfile.TarInfo], what: str) -> list[tarfile.TarInfo]:
    links = {m.name.rstrip("/"): m.linkname for m in members if m.issym()}
    files = {m.name.rstrip("/") for m in members if m.isfile()}
    kept = []
    for member in members:
        name = member.name.rstrip("/")
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or not name:
            raise InvalidInput(f"{what}: member {member.name!r} lies outside the destination")
        if any(str(parent) in links for parent in path.parents):
            raise InvalidInput(f"{what}: member {name!r} lies under a symlink")
        if member.issym():
            if member.linkname.startswith("/"):
                raise InvalidInput(
                    f"{what}: {name} is a symlink to {member.linkname} (absolute); not copied out"
                )
            if _resolve(path.parts[:-1], member.linkname, links, 0) is None:
                raise InvalidInput(
                    f"{what}: {name} is a symlink to {member.linkname}, outside the destination"
                )
        elif member.islnk():
            if member.linkname.rstrip("/") not in files:
                raise InvalidInput(f"{what}: {name} is a hard link to {member.linkname}")
        elif not (member.isfile() or member.isdir()):
            continue  # fifos and devices are not data
        kept.append(member)
    return kept


def _resolve(
    base: tuple[str, ...], target: str, links: dict[str, str], depth: int
) -> tuple[str, ...] | None:
    """Where ``target`` (relative to directory ``base``) leads within the archive, None if out."""
    if depth > _MAX_LINK_DEPTH or target.startswith("/"):
        return None
    here = list(base)
    for part in PurePosixPath(target).parts:
        if part == "..":
            if not here:
                return None
            here.pop()
        elif part != ".":
            here.append(part)
            key = "/".join(here)
            if key in links:
                found = _resolve(tuple(here[:-1]), links[key], links, depth + 1)
                if found is None:
                    return None
                here = list(found)
    return tuple(here)


def spool(chunks: Iterator[bytes]) -> IO[bytes]:
    """An engine archive stream in a temporary file, rewound."""
    archive = tempfile.TemporaryFile()  # noqa: SIM115 (the caller closes it)
    for chunk in chunks:
        archive.write(chunk)
    archive.seek(0)
    return archive
