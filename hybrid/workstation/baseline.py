"""The review diff's baseline: a git object store on the host, out of the sandbox's reach.

At copy-in the exact bytes that go into the workspace are recorded as git blobs (symlinks as
mode 120000) and one tree, in a bare repository under the workstation's host state directory.
``diff`` reads the workspace as a tar stream from the engine (nothing runs inside, nothing
inside is trusted), builds the current tree in a scratch object directory next to it and runs
``git diff`` on the host with a scrubbed environment. Nothing done inside the sandbox (fake git
dirs, symlinks, a fake git, a changed PATH) changes what the diff reports.

What counts as the workspace's files is what ``git add -A`` would take: every regular file and
symlink except under any ``.git`` directory; a new path that a ``.gitignore`` in the workspace
ignores is left out (paths that were in the baseline are always compared).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO

from hybrid import git
from hybrid.errors import EngineUnavailable, WorkstationError
from hybrid.workstation import state

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
REF = "refs/hybrid/base"
MODE_FILE, MODE_EXEC, MODE_LINK = 0o100644, 0o100755, 0o120000
# git itself ignores pattern files past 100 MB; an agent's huge .gitignore costs the host less.
_IGNORE_FILE_LIMIT = 1 << 20
_MEMORY_BLOB = 8 << 20
_CHUNK = 1 << 20
_GIT_OPTIONS = [
    "-c", "core.quotepath=off", "-c", "core.autocrlf=false", "-c", "gc.auto=0",
    "-c", "core.protectNTFS=false", "-c", "core.fsmonitor=false",
]  # fmt: skip

Entries = dict[str, tuple[int, str]]  # path -> (git mode, blob id)


class Baseline:
    """One bare repository holding the tree that went into a workstation."""

    def __init__(self, git_dir: Path) -> None:
        self.git_dir = git_dir

    @classmethod
    def of(cls, kind: state.Kind, engine_id: str) -> Baseline:
        """The baseline of a workstation (container id) or snapshot (image id); maybe empty."""
        return cls(state.path(kind, engine_id) / "baseline.git")

    def exists(self) -> bool:
        return (self.git_dir / "HEAD").is_file()

    def tree(self) -> str:
        """The recorded tree, or git's empty tree when nothing went in."""
        if not self.exists():
            return EMPTY_TREE
        found = self._git(["rev-parse", "-q", "--verify", f"{REF}^{{tree}}"], check=False)
        return found.strip().decode() or EMPTY_TREE

    def recorder(self) -> Recorder:
        """A sink for pack(): what it is fed becomes the baseline on ``commit()``."""
        if not self.exists():
            self.git_dir.parent.mkdir(parents=True, exist_ok=True)
            self._git(["init", "-q", "--bare", str(self.git_dir)], git_dir=False)
        return Recorder(self)

    def entries(self, tree: str | None = None) -> Entries:
        """Every path in the recorded tree (or in ``tree``)."""
        tree = tree or self.tree()
        if tree == EMPTY_TREE:
            return {}
        listed = self._git(["ls-tree", "-r", "-z", "--full-tree", tree])
        found: Entries = {}
        for line in listed.split(b"\0"):
            if line:
                meta, _, path = line.partition(b"\t")
                mode, _kind, oid = meta.split()
                found[os.fsdecode(path)] = (int(mode, 8), oid.decode())
        return found

    def write_tree(self, entries: Entries, objects: Path | None = None) -> str:
        """A tree of ``entries`` (blobs already stored); ``objects`` receives new trees."""
        with tempfile.TemporaryDirectory(prefix="hybrid-index-") as scratch:
            env = {"GIT_INDEX_FILE": str(Path(scratch) / "index"), **self._objects_env(objects)}
            listing = b"".join(
                b"%o %s\t%s\0" % (mode, oid.encode(), os.fsencode(path))
                for path, (mode, oid) in sorted(entries.items())
            )
            self._git(["update-index", "-z", "--index-info"], env=env, input=listing)
            return self._git(["write-tree"], env=env).strip().decode()

    def diff(self, archive: IO[bytes]) -> bytes:
        """git diff (binary-safe) from the baseline to the workspace in ``archive`` (engine tar)."""
        base = self.tree()
        known = self.entries(base)
        with tempfile.TemporaryDirectory(prefix="hybrid-diff-") as tmp:
            scratch = Path(tmp)
            objects = scratch / "objects"
            objects.mkdir()
            with open(scratch / "spool", "w+b") as spool:
                current, ignores, fresh = _read_workspace(archive, self._has, spool)
                new = [path for path in current if path not in known]
                if ignores and new:
                    for path in self._ignored(new, ignores, scratch / "tree"):
                        del current[path]
                needed = {oid for _, oid in current.values()}
                for oid, where in fresh.items():
                    if oid in needed:
                        _store(objects, spool, where)
            if not self.exists():
                self.recorder()  # a store for the scratch trees to sit next to
            tree = self.write_tree(current, objects)
            return self._git(
                ["diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", base, tree],
                env=self._objects_env(objects),
            )

    def copy_to(self, other: Baseline) -> None:
        """Give ``other`` the same baseline (objects are immutable: hard links where possible)."""
        if not self.exists():
            return
        shutil.rmtree(other.git_dir, ignore_errors=True)
        other.git_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(self.git_dir, other.git_dir, copy_function=_link_or_copy)

    def _has(self, oid: str) -> bool:
        return (self.git_dir / "objects" / oid[:2] / oid[2:]).is_file()

    def _ignored(self, paths: list[str], ignores: dict[str, bytes], root: Path) -> list[str]:
        # Only the .gitignore files are written on the host, into fresh directories.
        for path, data in ignores.items():
            target = root.joinpath(*PurePosixPath(path).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        root.mkdir(exist_ok=True)
        listed = self._git(
            ["check-ignore", "--no-index", "-z", "--stdin"],
            env={"GIT_WORK_TREE": str(root)},
            input=b"".join(os.fsencode(p) + b"\0" for p in paths),
            cwd=root,
            check=False,
        )
        return [os.fsdecode(p) for p in listed.split(b"\0") if p]

    def _objects_env(self, objects: Path | None) -> dict[str, str]:
        if objects is None:
            return {}
        return {
            "GIT_OBJECT_DIRECTORY": str(objects),
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(self.git_dir / "objects"),
        }

    def _git(
        self,
        args: list[str],
        *,
        env: dict[str, str] | None = None,
        input: bytes | None = None,
        cwd: Path | None = None,
        check: bool = True,
        git_dir: bool = True,
    ) -> bytes:
        # Nothing from the user's or the system's git config (aliases, pagers, excludes,
        # attributes, external diff drivers) takes part: hybrid.git's environment, and a home
        # with no files in it.
        home = str(self.git_dir / "no-home")
        scrubbed = {
            "HOME": home,
            "XDG_CONFIG_HOME": home,
            **({"GIT_DIR": str(self.git_dir)} if git_dir else {}),
            **(env or {}),
        }
        try:
            done = git.run_own(
                [*_GIT_OPTIONS, *args],
                cwd=cwd or self.git_dir.parent,
                env=scrubbed,
                input=input,
                timeout=None,
            )
        except FileNotFoundError:
            raise EngineUnavailable(
                "git is needed on the host for workstation diffs (apt-get install git)"
            ) from None
        # check-ignore exits 1 when nothing matched.
        if (check and done.returncode != 0) or done.returncode > 1:
            message = done.stderr.decode(errors="replace").strip().splitlines()
            raise WorkstationError(f"git {args[0]} failed: {(message or ['?'])[-1]}")
        return done.stdout


class Recorder:
    """What pack() feeds: blobs go straight into the baseline's object store."""

    def __init__(self, baseline: Baseline) -> None:
        self._baseline = baseline
        self._objects = baseline.git_dir / "objects"
        self._pending: dict[str, tuple[int, _Blob]] = {}

    def file(self, path: str, executable: bool, size: int) -> Callable[[bytes], None]:
        if _in_git_dir(path):
            return _discard
        blob = _Blob(self._objects, size)
        self._pending[path] = (MODE_EXEC if executable else MODE_FILE, blob)
        return blob.feed

    def symlink(self, path: str, target: str) -> None:
        if _in_git_dir(path):
            return
        data = os.fsencode(target)
        blob = _Blob(self._objects, len(data))
        blob.feed(data)
        self._pending[path] = (MODE_LINK, blob)

    def commit(self) -> str:
        """Record everything fed so far over any earlier baseline; returns the tree id."""
        entries = self._baseline.entries()
        added: Entries = {}
        for path, (mode, blob) in self._pending.items():
            if blob.oid is None:
                raise WorkstationError(f"{path}: changed while it was being copied in")
            added[path] = (mode, blob.oid)
        # A new path replaces whatever an earlier copy had at it, above it or below it.
        for path in added:
            parents = {str(p) for p in PurePosixPath(path).parents}
            for old in [o for o in entries if o in parents or o.startswith(path + "/")]:
                del entries[old]
        entries.update(added)
        tree = self._baseline.write_tree(entries)
        self._baseline._git(["update-ref", REF, tree])
        return tree


class _Blob:
    """A blob fed in chunks; stored once ``size`` bytes arrived (in memory when small)."""

    def __init__(self, objects: Path, size: int) -> None:
        self._objects = objects
        self._size = size
        self._left = size
        self._header = b"blob %d\0" % size
        self._sha = hashlib.sha1(self._header)
        self._chunks: list[bytes] = []
        self._spill: IO[bytes] | None = None
        self._zip: zlib._Compress | None = None
        self.oid: str | None = None
        if size == 0:
            self._done()

    def feed(self, chunk: bytes) -> None:
        self._sha.update(chunk)
        self._left -= len(chunk)
        if self._spill is None and self._size <= _MEMORY_BLOB:
            self._chunks.append(chunk)
        else:
            if self._spill is None:
                self._spill = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed in _done)
                    dir=self._objects, prefix="tmp_obj_", delete=False
                )
                self._zip = zlib.compressobj(1)
                self._spill.write(self._zip.compress(self._header))
            assert self._zip is not None
            self._spill.write(self._zip.compress(chunk))
        if self._left == 0 and self.oid is None:
            self._done()

    def _done(self) -> None:
        self.oid = self._sha.hexdigest()
        target = self._objects / self.oid[:2] / self.oid[2:]
        if self._spill is not None:
            assert self._zip is not None
            self._spill.write(self._zip.flush())
            self._spill.close()
            if target.exists():
                os.unlink(self._spill.name)
            else:
                target.parent.mkdir(exist_ok=True)
                os.replace(self._spill.name, target)
        elif not target.exists():
            _write_object(target, zlib.compress(self._header + b"".join(self._chunks), 1))
        self._chunks = []


def _store(objects: Path, spool: IO[bytes], where: bytes | tuple[int, int]) -> None:
    if isinstance(where, bytes):
        _Blob(objects, len(where)).feed(where)
        return
    offset, size = where
    blob = _Blob(objects, size)
    spool.seek(offset)
    while size > 0:
        chunk = spool.read(min(size, _CHUNK))
        blob.feed(chunk)
        size -= len(chunk)


def _write_object(target: Path, compressed: bytes) -> None:
    target.parent.mkdir(exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix="tmp_obj_", delete=False) as tmp:
        tmp.write(compressed)
    os.replace(tmp.name, target)


def _read_workspace(
    archive: IO[bytes], known: Callable[[str], bool], spool: IO[bytes]
) -> tuple[Entries, dict[str, bytes], dict[str, bytes | tuple[int, int]]]:
    """The workspace's files from an engine tar: entries, .gitignore texts, blobs not stored yet.

    New content waits in a spool file until the ignore rules are known, so nothing an
    ignored directory holds is compressed or stored.
    """
    current: Entries = {}
    ignores: dict[str, bytes] = {}
    # blob id -> its bytes (a symlink's target) or (offset, size) in the spool
    fresh: dict[str, bytes | tuple[int, int]] = {}
    try:
        with tarfile.open(fileobj=archive, mode="r|") as tar:
            for member in tar:
                path = _inside(member.name)
                if path is None or _in_git_dir(path):
                    continue
                if member.issym():
                    data = os.fsencode(member.linkname)
                    oid = _oid(data)
                    current[path] = (MODE_LINK, oid)
                    if not known(oid):
                        fresh[oid] = data
                elif member.islnk():
                    linked = _inside(member.linkname)
                    if linked in current:
                        current[path] = current[linked]
                elif member.isfile():
                    reader = tar.extractfile(member)
                    assert reader is not None
                    offset = spool.seek(0, os.SEEK_END)
                    sha = hashlib.sha1(b"blob %d\0" % member.size)
                    while chunk := reader.read(_CHUNK):
                        sha.update(chunk)
                        spool.write(chunk)
                    oid = sha.hexdigest()
                    mode = MODE_EXEC if member.mode & 0o100 else MODE_FILE
                    current[path] = (mode, oid)
                    if (
                        path.rsplit("/", 1)[-1] == ".gitignore"
                        and member.size <= _IGNORE_FILE_LIMIT
                    ):
                        spool.seek(offset)
                        ignores[path] = spool.read(member.size)
                    if known(oid) or oid in fresh:
                        spool.truncate(offset)
                    else:
                        fresh[oid] = (offset, member.size)
    except tarfile.TarError as exc:
        raise WorkstationError(f"reading the workspace failed: {exc}") from None
    return current, ignores, fresh


def _inside(name: str) -> str | None:
    # Engine archives name members "<workspace dir name>/<path>".
    parts = PurePosixPath(name).parts[1:]
    if not parts:
        return None
    if ".." in parts or name.startswith("/"):
        raise WorkstationError(f"the engine sent a member outside the workspace: {name!r}")
    return "/".join(parts)


def _in_git_dir(path: str) -> bool:
    # What `git add -A` never takes: anything in a .git directory (the repository's own
    # history, or a nested repository's).
    return ".git" in path.split("/")


def _discard(chunk: bytes) -> None:
    pass


def _oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
