"""What git will write: a candidate patch applied on the host into a scratch index.

The gate judges this result, never the patch's text. ``git apply`` strips one leading path
component whatever it is, squashes ``//``, deletes the old file of a section whose ``---`` and
``+++`` name different paths, and decodes binary patches: a reader of the text can disagree with
git about which paths change. Here git itself applies the patch (``git apply --cached`` with the
workstation's options) to an index holding the host's copy of every path the patch could name,
in a scratch repository that shares nothing with the user's. The changed paths, modes and
contents come from that index, and the reviewed diff is ``git diff`` of the two trees, fixed
before any untrusted code runs; the workstation then applies that diff, not the patch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import subprocess
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel

from hybrid import git
from hybrid.errors import EngineUnavailable, InvalidDiff, InvalidInput

MODE_FILE, MODE_EXEC, MODE_LINK, MODE_GITLINK = 0o100644, 0o100755, 0o120000, 0o160000
NULL_OID = "0" * 40
APPLY_OPTIONS = ["--whitespace=nowarn"]
"""What the workstation passes to ``git apply`` besides the patch (hybrid.agent.gate.run_in)."""

HOST_FILE_BYTES = 64 << 20
"""A touched file larger than this is not judged (the patch is refused)."""

# The same options the workstation's review diff uses (hybrid.workstation.baseline), so the
# diff computed here and the one read back from the workstation agree byte for byte.
_GIT_OPTIONS = [
    "-c", "core.quotepath=off", "-c", "core.autocrlf=false", "-c", "gc.auto=0",
    "-c", "core.protectNTFS=false", "-c", "core.fsmonitor=false", "-c", "core.symlinks=true",
]  # fmt: skip
_DIFF = ["diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv"]

Entry = tuple[int, str]  # (git mode, blob id)


class Change(BaseModel):
    """One path git writes (renames are a deletion and an addition: both paths are judged)."""

    path: str
    status: Literal["added", "deleted", "modified", "type-changed"]
    old_mode: int | None = None
    new_mode: int | None = None
    old_oid: str | None = None
    new_oid: str | None = None


def _git(
    args: list[str],
    *,
    cwd: Path,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """Every git call of this module, in the scratch repository it made: hybrid.git's
    environment and switches, and a home with nothing in it."""
    home = str(cwd / "no-home")
    scrubbed = {
        "HOME": home,
        "XDG_CONFIG_HOME": home,
        "GIT_DIR": str(cwd / ".git"),
        "GIT_WORK_TREE": str(cwd),
        **(env or {}),
    }
    try:
        done = git.run_own([*_GIT_OPTIONS, *args], cwd=cwd, env=scrubbed, input=input, timeout=None)
    except FileNotFoundError:
        raise EngineUnavailable("git is needed on the host to judge a patch") from None
    if check and done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise InvalidInput(f"git {args[0]} failed: {(message or ['?'])[-1]}")
    return done


class Applied:
    """The patch as git applied it in a scratch repository (use as a context manager)."""

    def __init__(self, scratch: Path, base: dict[str, Entry]) -> None:
        self.scratch = scratch
        self.base_entries = base
        self._set(sorted(base.items()))
        self.base = self.result = self._write_tree()
        self.changes: list[Change] = []

    def _git(self, args: list[str], input: bytes | None = None, check: bool = True) -> bytes:
        return _git(args, cwd=self.scratch, input=input, check=check).stdout

    def _write_tree(self) -> str:
        return self._git(["write-tree"]).strip().decode()

    def _set(self, entries: Iterable[tuple[str, Entry | None]]) -> None:
        # mode 0 removes a path from the index.
        lines = b"".join(
            b"%o %s\t%s\0" % (e[0], e[1].encode(), os.fsencode(p))
            if e is not None
            else b"0 %s\t%s\0" % (NULL_OID.encode(), os.fsencode(p))
            for p, e in entries
        )
        if lines:
            self._git(["update-index", "-z", "--index-info"], input=lines)

    def apply(self, patch: bytes) -> None:
        done = _git(
            ["apply", "--cached", *APPLY_OPTIONS, "-"],
            cwd=self.scratch,
            input=patch,
            check=False,
        )
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip().splitlines()
            raise InvalidDiff(f"the patch does not apply: {why[0] if why else 'git apply failed'}")
        self.result = self._write_tree()
        self.changes = self._changes(self.base, self.result)

    def _changes(self, old: str, new: str) -> list[Change]:
        raw = self._git(["diff-tree", "-r", "-z", "--no-renames", "--raw", old, new])
        fields = raw.split(b"\0")
        changes = []
        for i in range(0, len(fields) - 1, 2):
            meta, path = fields[i].decode(), os.fsdecode(fields[i + 1])
            old_mode, new_mode, old_oid, new_oid, letter = meta.lstrip(":").split()
            status = {"A": "added", "D": "deleted", "M": "modified", "T": "type-changed"}[letter]
            changes.append(
                Change(
                    path=path,
                    status=status,
                    old_mode=int(old_mode, 8) or None,
                    new_mode=int(new_mode, 8) or None,
                    old_oid=None if old_oid == NULL_OID else old_oid,
                    new_oid=None if new_oid == NULL_OID else new_oid,
                )
            )
        return changes

    def diff(self, tree: str | None = None) -> bytes:
        """The review diff from the base to ``tree`` (the applied result by default)."""
        return self._git([*_DIFF, self.base, tree or self.result])

    def restoring(self, paths: Iterable[str]) -> str:
        """The result tree with ``paths`` put back as they were before the patch."""
        self._set((p, self.base_entries.get(p)) for p in sorted(set(paths)))
        return self._write_tree()

    def contents(self, oids: Iterable[str]) -> dict[str, bytes]:
        """The bytes of each blob (one ``cat-file --batch`` for all)."""
        wanted = sorted({o for o in oids if o})
        if not wanted:
            return {}
        out = self._git(["cat-file", "--batch"], input="".join(f"{o}\n" for o in wanted).encode())
        found: dict[str, bytes] = {}
        at = 0
        for oid in wanted:
            end = out.index(b"\n", at)
            header = out[at:end].split()
            at = end + 1
            if len(header) < 3:
                continue  # "<oid> missing"
            size = int(header[2])
            found[oid] = out[at : at + size]
            at += size + 1
        return found


@contextlib.contextmanager
def host_apply(repo: Path, patch: str | bytes) -> Iterator[Applied]:
    """Apply ``patch`` as git would in a copy of ``repo`` (every path it names read from the
    host, never through a symlink). Raises InvalidDiff when git refuses the patch."""
    data = patch.encode("utf-8", "surrogateescape") if isinstance(patch, str) else patch
    with tempfile.TemporaryDirectory(prefix="hybrid-judge-") as tmp:
        scratch = Path(tmp)
        _git(
            ["init", "-q", "--template=", str(scratch)],
            cwd=scratch,
            env={"GIT_DIR": str(scratch / ".git")},
        )
        base = _read_base(Path(repo), named_paths(data), scratch / ".git" / "objects")
        applied = Applied(scratch, base)
        applied.apply(data)
        yield applied


# -- which paths a patch can make git read -------------------------------------------------

_HEADER = re.compile(
    rb"^(?:diff --git |--- |\+\+\+ |rename from |rename to |copy from |copy to |"
    rb"Binary files |\*\*\* |Index: )(.*)$",
    re.M,
)


def _unquote(text: bytes) -> bytes:
    inner = text[1:-1] if len(text) >= 2 and text.endswith(b'"') else text[1:]
    out = bytearray()
    i = 0
    escapes = {ord("n"): 10, ord("t"): 9, ord('"'): 34, ord("\\"): 92, ord("a"): 7, ord("b"): 8}
    escapes.update({ord("f"): 12, ord("r"): 13, ord("v"): 11})
    while i < len(inner):
        c = inner[i]
        if c == 92 and i + 1 < len(inner):
            n = inner[i + 1]
            if 48 <= n <= 51 and re.fullmatch(rb"[0-7]{3}", inner[i + 1 : i + 4]):
                out.append(int(inner[i + 1 : i + 4], 8))
                i += 4
                continue
            out.append(escapes.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


def _names(rest: bytes) -> list[bytes]:
    """Every name a header's rest could stand for (both halves of a ``diff --git`` line)."""
    rest = rest.rstrip(b"\r")
    found = [rest, rest.split(b"\t", 1)[0]]
    for quoted in re.findall(rb'"(?:[^"\\]|\\.)*"', rest):
        found.append(_unquote(quoted))
    for i in [m.start() for m in re.finditer(rb" ", rest)]:
        found += [rest[:i], rest[i + 1 :]]
    return found


def named_paths(patch: bytes) -> set[str]:
    """A superset of the repository paths git could read for ``patch``: each name in a header,
    as written and with one leading component stripped, slashes squashed."""
    paths: set[str] = set()
    for match in _HEADER.finditer(patch):
        for name in _names(match.group(1)):
            parts = [p for p in os.fsdecode(name).strip().split("/") if p not in ("", ".")]
            for candidate in (parts, parts[1:]):
                if candidate and ".." not in candidate and len(candidate) < 64:
                    paths.add("/".join(candidate))
    return paths


# -- the host's copy of those paths ----------------------------------------------------------


def _read_base(repo: Path, paths: set[str], objects: Path) -> dict[str, Entry]:
    """Host entries (mode, blob written to ``objects``) for ``paths`` and any file or symlink
    standing where one of their parent directories would be; only what a workstation copies."""
    from hybrid.workstation.archive import repo_selection

    select = repo_selection(repo)
    wanted = set(paths)
    for path in paths:
        wanted.update(str(p) for p in PurePosixPath(path).parents if str(p) != ".")
    entries: dict[str, Entry] = {}
    root = os.open(repo, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for path in sorted(wanted):
            if not select.take(path, False):
                continue
            found = _host_entry(root, path)
            if found is not None:
                mode, data = found
                entries[path] = (mode, _write_blob(objects, data))
    finally:
        os.close(root)
    return entries


def _host_entry(root: int, path: str) -> tuple[int, bytes] | None:
    """A regular file's or symlink's (mode, bytes) at ``path``, never through a symlink."""
    parts = path.split("/")
    fd = os.dup(root)
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError:
                return None  # missing, or not a directory: git sees it at that path itself
            os.close(fd)
            fd = inner
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            return MODE_LINK, os.fsencode(os.readlink(parts[-1], dir_fd=fd))
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > HOST_FILE_BYTES:
            raise InvalidInput(f"{path}: larger than {HOST_FILE_BYTES >> 20} MiB, not judged")
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        with os.fdopen(os.open(parts[-1], flags, dir_fd=fd), "rb") as file:
            data = file.read(HOST_FILE_BYTES + 1)
        return (MODE_EXEC if st.st_mode & 0o100 else MODE_FILE), data
    finally:
        os.close(fd)


def _write_blob(objects: Path, data: bytes) -> str:
    raw = b"blob %d\0" % len(data) + data
    oid = hashlib.sha1(raw).hexdigest()
    target = objects / oid[:2] / oid[2:]
    if not target.exists():
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(zlib.compress(raw, 1))
    return oid


__all__ = ["APPLY_OPTIONS", "Applied", "Change", "host_apply", "named_paths"]
