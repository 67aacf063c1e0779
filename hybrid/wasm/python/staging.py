"""The runs' scratch root and their input files, staged into read-only directories that repeated
runs with the same inputs share."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from hybrid import owner
from hybrid.errors import InvalidInput
from hybrid.paths import read_input
from hybrid.policy import check_text

MAX_INPUT_BYTES = 64 * 1024**2
"""The most input-file bytes one run may bring (they are copied into a staged directory)."""

STAGED_SETS = 16
"""How many distinct sets of input files stay staged (an agent's loop reuses the same inputs)."""

STAGED_BYTES = 256 * 1024**2
"""...and at most this many bytes of them."""

InputFiles = Mapping[str, bytes | str | Path] | Sequence[str | Path]
"""Input files: a mapping of name -> content (bytes, text or a host Path), or host paths
(each visible under its base name)."""

_root_lock = threading.Lock()
_root: Path | None = None


def scratch_root() -> Path:
    """A private directory per process for the runs' pipes and input files (removed at exit;
    named for the process, so a later one reaps it if this one is killed)."""
    global _root
    if _root is None:
        with _root_lock:
            if _root is None:
                owner.reap_once()
                root = owner.make_dir("hybrid-py-")
                (root / "empty").mkdir(mode=0o500)
                atexit.register(shutil.rmtree, root, ignore_errors=True)
                _root = root
    return _root


class _Staged:
    """One staged directory, its size and how many runs use it now (never evicted then)."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.users = 0


_staged_lock = threading.Lock()
_staged_sets: OrderedDict[str, _Staged] = OrderedDict()


def stage(files: InputFiles | None, root: Path) -> tuple[Path, str | None]:
    """A read-only directory holding exactly ``files`` (the guest's working directory), and
    the key to ``release`` once the run is over (None: nothing to release).

    Directories are keyed by the files' names and contents, so repeated runs with the same
    inputs reuse one (the guest cannot write to it), and the least recently used is removed.
    """
    if not files:
        return root / "empty", None
    items = _read_inputs(files)
    digest = hashlib.sha256()
    for name, data in items:
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    key = digest.hexdigest()[:24]
    with _staged_lock:
        entry = _staged_sets.get(key)
        if entry is not None:
            _staged_sets.move_to_end(key)
            entry.users += 1
            return entry.path, key
        tmp = Path(tempfile.mkdtemp(prefix=".stage-", dir=root))
        for name, data in items:
            dest = tmp.joinpath(*PurePosixPath(name).parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        path = root / f"inputs-{key}"
        os.replace(tmp, path)
        entry = _staged_sets[key] = _Staged(path, sum(len(data) for _, data in items))
        entry.users += 1
        idle = [k for k, e in _staged_sets.items() if e.users == 0]  # oldest first
        total = sum(e.size for e in _staged_sets.values())
        while idle and (len(_staged_sets) > STAGED_SETS or total > STAGED_BYTES):
            old = _staged_sets.pop(idle.pop(0))
            total -= old.size
            shutil.rmtree(old.path, ignore_errors=True)
        return path, key


def release(key: str | None) -> None:
    """A run no longer uses the staged directory of ``key`` (it may be evicted again)."""
    if key is None:
        return
    with _staged_lock:
        entry = _staged_sets.get(key)
        if entry is not None:
            entry.users -= 1


def _read_inputs(files: InputFiles) -> list[tuple[str, bytes]]:
    if isinstance(files, Mapping):
        pairs = list(files.items())
    else:
        pairs = [(Path(p).name, Path(p)) for p in files]
    items: list[tuple[str, bytes]] = []
    total = 0
    for name, content in pairs:
        check_text(name, "input file name")
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts or rel.parts == (".",):
            raise InvalidInput(f"input file name {name!r} must be a relative path without '..'")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # WASI paths are UTF-8: the guest could not name it
            shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            raise InvalidInput(
                f"input file name {shown!r} is not UTF-8; give it a UTF-8 name, e.g. "
                "files={'data.csv': path}"
            ) from None
        if isinstance(content, Path):
            check_text(str(content), "input file", data=True)
            data = read_input(content, "input file")
        else:
            data = content.encode() if isinstance(content, str) else bytes(content)
        total += len(data)
        _check_total(total)
        items.append((rel.as_posix(), data))
    return items


def _check_total(total: int) -> None:
    if total > MAX_INPUT_BYTES:
        raise InvalidInput(
            f"input files total over {MAX_INPUT_BYTES // 1024**2} MiB; the python-wasm tier is for "
            "small inputs (use the container tier for large data)"
        )
