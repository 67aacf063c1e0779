"""Scan a checkout and bring every source file's graph inputs up to date, incrementally.

Inside a git repository the content key of a file is its blob id from ``git ls-files -s``
(no hashing); only files ``git status`` reports as modified or untracked are read and
hashed. Files whose key is not cached are read, in parallel across cores when there are
many, and stored. A second run on an unchanged tree reads nothing.

What is read of a file up front is what the graph needs: Python files are scanned lexically
(``lexical.scan`` gives their ``Slim``, several times faster than a parse), other files are
parsed with tree-sitter (their ``Slim`` comes from the tags). A Python file's full tags
(signatures, line spans) are parsed when something first asks for them
(``RepoIndex.payloads``): a map shows a few dozen files of thousands.

The checkout is hostile: every file is listed with ``lstat`` and read by ``hybrid.repofs``,
so a symlink (``src/x.py -> /etc/shadow``, a tracked ``pkg/`` replaced by a link), a FIFO or a
device named like a source is skipped and named in ``skipped``, never read.
"""

from __future__ import annotations

import gc
import hashlib
import marshal
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import NamedTuple

from hybrid.context import lexical
from hybrid.context.cache import _VERSION, TagCache
from hybrid.context.git import git_output
from hybrid.context.graph import Slim, slim
from hybrid.context.languages import language_for
from hybrid.context.tags import FileTags, Payload, ctags_available, extract_ctags, extract_file
from hybrid.errors import ContextError
from hybrid.repofs import MAX_READ_BYTES, MISSING, Refused, Tree, read_file

MAX_FILE_BYTES = MAX_READ_BYTES
_SKIP_DIRS = frozenset(
    {"node_modules", "__pycache__", "venv", ".venv", "build", "dist", "target", "vendor"}
)

Progress = Callable[[int, int], None]


class Skipped(NamedTuple):
    """A file left out of the index (or without definitions), and why."""

    path: str
    reason: str


@dataclass
class SourceFile:
    """One file of the checkout: POSIX path relative to the root, content id, language."""

    path: str
    content_id: str
    lang: str
    size: int = 0
    """Bytes on disk when ``scan`` listed it (0: not known)."""


@dataclass
class IndexStats:
    """What one build did."""

    files: int = 0
    parsed: int = 0
    """Files read now: parsed (tags) or scanned (a Python file's graph inputs)."""
    cached: int = 0
    hashed: int = 0
    workers: int = 1
    scan_ms: float = 0.0
    parse_ms: float = 0.0


@dataclass
class RepoIndex:
    """The source files of a checkout; graph inputs (``Slim``) and tags (``Payload``) load
    lazily from the cache, and tags not cached yet are parsed when first asked for."""

    root: Path
    files: list[SourceFile]
    cache: TagCache
    fingerprint: str
    skipped: list[Skipped] = field(default_factory=list)
    stats: IndexStats = field(default_factory=IndexStats)
    _payloads: dict[str, Payload] = field(default_factory=dict)
    _slims: dict[str, Slim] = field(default_factory=dict)
    """Graph inputs scanned by ``build_index``, by cache key, until ``slims`` hands them over."""
    _files_by_path: dict[str, SourceFile] = field(default_factory=dict)

    def payloads(self, paths: list[str] | None = None) -> dict[str, Payload]:
        """Payloads by path (all files when ``paths`` is None), from memory or the cache,
        else parsed now (and cached)."""
        by_path = self._by_path()
        wanted = list(by_path) if paths is None else [p for p in paths if p in by_path]
        missing = [p for p in wanted if p not in self._payloads]
        if missing:
            keys = {_key(by_path[p]): p for p in missing}
            for key, payload in self.cache.payloads(keys).items():
                self._payloads[keys[key]] = payload
            unparsed = [by_path[p] for p in missing if p not in self._payloads]
            if unparsed:
                self._parse_now(unparsed)
        return {p: self._payloads[p] for p in wanted if p in self._payloads}

    def _parse_now(self, files: list[SourceFile]) -> None:
        # In this process: a pool forked from one that holds a graph raised a sympy map's peak
        # memory by ~25 MB (116 -> 143 MB) to save ~0.06 s.
        by_key: dict[str, list[SourceFile]] = {}
        for f in files:
            by_key.setdefault(_key(f), []).append(f)
        todo = [group[0] for group in by_key.values()]
        parsed = dict(chain.from_iterable(_parse(self.root, todo, 1, None, scan_lexical=False)))
        self.cache.put_many((_key(f), parsed[f.path]) for f in todo)
        for f in todo:
            self._hold(parsed[f.path], by_key[_key(f)])

    def _hold(self, data: bytes, same: list[SourceFile]) -> None:
        """A stored payload, kept in memory for every file with its contents."""
        payload = Payload._make(marshal.loads(data))
        for f in same:
            self._payloads[f.path] = payload

    def slims(self, keys: set[str]) -> dict[str, Slim]:
        """Graph inputs by cache key: from memory or the cache, else made now for this
        index's files with those keys (and cached); keys of other contents are only looked
        up in the cache."""
        # Handed over once (the graph holds what it needs of them; a later ask reads the
        # cache): a large checkout's references would otherwise stay in memory twice.
        found = {k: self._slims.pop(k) for k in keys if k in self._slims}
        if len(found) < len(keys):
            found.update(self.cache.slims(keys - found.keys()))
        if len(found) < len(keys):
            first: dict[str, SourceFile] = {}
            for f in self.files:
                k = _key(f)
                if k in keys and k not in found:
                    first.setdefault(k, f)
            fresh: dict[str, Slim] = {}
            scan_now = [f for f in first.values() if f.lang == lexical.LANG]
            for f in scan_now:
                fresh[_key(f)] = _scan_file(str(self.root), f.path)
            from_tags = [f.path for f in first.values() if f.lang != lexical.LANG]
            for path, payload in self.payloads(from_tags).items():
                fresh[_key(self._by_path()[path])] = slim(payload)
            if fresh:
                self.cache.put_slims((k, _stored(v)) for k, v in sorted(fresh.items()))
                found.update(fresh)
        return found

    def _by_path(self) -> dict[str, SourceFile]:
        if len(self._files_by_path) != len(self.files):
            self._files_by_path = {f.path: f for f in self.files}
        return self._files_by_path

    def tags(self, path: str) -> FileTags:
        """The tags of one file."""
        payload = self.payloads([path]).get(path)
        if payload is None:
            raise ContextError(f"{path} is not an indexed source file of {self.root}")
        return FileTags.from_payload(path, payload)

    def empty_files(self) -> list[Skipped]:
        """Files that yielded no definitions, with the reason (reported, never dropped)."""
        out = []
        for path, payload in sorted(self.payloads().items()):
            if not payload.defs:
                out.append(Skipped(path, payload.error or "no definitions found"))
        return out


def blob_id(data: bytes) -> str:
    """The git blob id of ``data`` (so hashed and indexed files share cache keys)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _wanted(path: str) -> str | None:
    lang = language_for(path)
    if lang is None:
        return None
    parts = path.split("/")
    if any(p in _SKIP_DIRS or (p.startswith(".") and len(p) > 1) for p in parts[:-1]):
        return None
    return lang


def _scan_git(root: Path, stats: IndexStats, tree: Tree) -> list[SourceFile | Skipped] | None:
    top_raw = git_output(root, "rev-parse", "--show-toplevel")
    if top_raw is None:
        return None
    top = Path(top_raw.decode().strip())
    prefix = root.resolve().relative_to(top.resolve()).as_posix()
    prefix = "" if prefix == "." else prefix + "/"
    listing = git_output(top, "ls-files", "-s", "-z")
    status = git_output(top, "status", "--porcelain", "-z", "--untracked-files=all", "--no-renames")
    if listing is None or status is None:
        return None
    ids: dict[str, str] = {}
    links: set[str] = set()
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        meta, _, name = entry.partition(b"\t")
        mode, blob, _stage = meta.split(b" ")
        if mode in (b"100644", b"100755"):
            ids[name.decode("utf-8", "surrogateescape")] = blob.decode()
        elif mode == b"120000":
            links.add(name.decode("utf-8", "surrogateescape"))
    dirty: set[str] = set()
    for entry in status.split(b"\0"):
        if len(entry) < 4:
            continue
        xy, changed = entry[:2], entry[3:].decode("utf-8", "surrogateescape")
        if xy == b"??" or xy[1:2] not in (b" ",):
            dirty.add(changed)
        elif xy[0:1] == b"D":
            ids.pop(changed, None)
    found: list[SourceFile | Skipped] = []
    for tracked in sorted(set(ids) | dirty | links):
        if prefix and not tracked.startswith(prefix):
            continue
        rel = tracked[len(prefix) :]
        lang = _wanted(rel)
        if lang is None:
            continue
        # Clean tracked files too: git's index says nothing of a parent directory replaced by
        # a symlink (with skip-worktree or assume-unchanged, not even that the file changed).
        st, why = tree.check(rel)
        if st is None:
            if why != MISSING:
                found.append(Skipped(rel, why or ""))
            continue
        if tracked in dirty or tracked not in ids:
            made = _hashed(root, rel, lang, st.st_size, stats)
        else:
            made = SourceFile(rel, ids[tracked], lang, st.st_size)
        if made is not None:
            found.append(made)
    return found


def _hashed(
    root: Path, rel: str, lang: str, size: int, stats: IndexStats
) -> SourceFile | Skipped | None:
    """A changed or unversioned file with the blob id of its content (read safely)."""
    if size > MAX_FILE_BYTES:
        return Skipped(rel, f"larger than {MAX_FILE_BYTES} bytes")
    try:
        data = read_file(root, rel, MAX_FILE_BYTES)
    except Refused as exc:
        return None if exc.reason == MISSING else Skipped(rel, exc.reason)
    stats.hashed += 1
    return SourceFile(rel, blob_id(data), lang, len(data))


def _scan_walk(root: Path, stats: IndexStats, tree: Tree) -> list[SourceFile | Skipped]:
    found: list[SourceFile | Skipped] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath).relative_to(root).as_posix()
        base = "" if base == "." else base + "/"
        kept = []
        for d in sorted(dirnames):
            if d in _SKIP_DIRS or d.startswith("."):
                continue
            if os.path.islink(os.path.join(dirpath, d)):  # os.walk lists it, never enters it
                found.append(Skipped(base + d, "a symlink (not followed)"))
            else:
                kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = base + name
            lang = _wanted(rel)
            if lang is None:
                continue
            st, why = tree.check(rel)
            if st is None:
                if why != MISSING:
                    found.append(Skipped(rel, why or ""))
                continue
            made = _hashed(root, rel, lang, st.st_size, stats)
            if made is not None:
                found.append(made)
    return found


def scan(root: Path, stats: IndexStats | None = None) -> tuple[list[SourceFile], list[Skipped]]:
    """Source files under ``root`` with content ids, and files skipped with the reason.

    Only regular files reached without a symlink are indexed; a source-named symlink, FIFO,
    device or a file under a symlinked directory is skipped and named, never read."""
    stats = stats if stats is not None else IndexStats()
    tree = Tree(root)
    found = _scan_git(root, stats, tree)
    if found is None:
        found = _scan_walk(root, stats, tree)
    kept: list[SourceFile] = []
    skipped: list[Skipped] = []
    for f in found:
        if isinstance(f, Skipped):
            skipped.append(f)
        elif f.size > MAX_FILE_BYTES:
            skipped.append(Skipped(f.path, f"larger than {MAX_FILE_BYTES} bytes"))
        else:
            kept.append(f)
    return kept, skipped


def _key(f: SourceFile) -> str:
    return TagCache.key(f.content_id, f.lang)


def _stored(value: Payload | Slim) -> bytes:
    """A payload or slim as the tag cache stores it (marshal takes plain tuples only)."""
    return marshal.dumps(tuple(value))


def _scan_file(root: str, rel: str) -> Slim:
    """A Python file's graph inputs; a file not read has none, and says why."""
    try:
        return lexical.scan(read_file(root, rel))
    except Refused as exc:
        return slim(Payload.empty(lexical.LANG, f"not read: {exc.reason}"))


def _read(root: str, rel: str, lang: str, scan_lexical: bool) -> bytes:
    """One file's stored graph input (a Slim, for a Python file when ``scan_lexical``) or
    tags (a Payload)."""
    if scan_lexical and lang == lexical.LANG:
        return _stored(_scan_file(root, rel))
    return _stored(extract_file(root, rel, lang))


def _read_chunk(
    root: str, scan_lexical: bool, chunk: list[tuple[str, str]]
) -> list[tuple[str, bytes]]:
    return [(rel, _read(root, rel, lang, scan_lexical)) for rel, lang in chunk]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a block (as a decorator: for a call).

    Reading a large checkout's graph inputs, building its graph and rendering its map make
    millions of containers (lists, dicts, tuples) and no reference cycles, so each pass of the
    collector over them frees nothing: on sympy they took ~0.14 s of a cold map. Objects are
    still freed as their references go; cycles wait for the collector's next pass after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def default_workers() -> int:
    """Cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# A pool pays when the files to read take longer than forking it (~20 ms): about 1 MB for the
# lexical scan (~50 ns a byte), a sixth of that for a tree-sitter parse (~300 ns a byte).
_PARALLEL_BYTES = 1_000_000
_PARSE_COST = 6


def _parse(
    root: Path,
    todo: list[SourceFile],
    workers: int,
    progress: Progress | None,
    *,
    scan_lexical: bool,
    stats: IndexStats | None = None,
) -> Iterator[list[tuple[str, bytes]]]:
    """Read ``todo``: batches of (path, marshalled payload) (a slim for a Python file when
    ``scan_lexical``), each as soon as it is read, so the caller stores one batch while the
    pool reads the next. ``stats.workers`` says how many processes read them."""
    ctags_files = [(f.path, f.lang) for f in todo if f.lang.startswith("ctags:")]
    ts_files = [f for f in todo if not f.lang.startswith("ctags:")]
    if ctags_files:
        if ctags_available():
            payloads = extract_ctags(str(root), ctags_files)
        else:
            payloads = {
                p: Payload.empty(lang, "no grammar and universal-ctags is not installed")
                for p, lang in ctags_files
            }
        yield [(p, _stored(v)) for p, v in payloads.items()]
    sizes = {f.path: f.size or _size(root / f.path) for f in ts_files}
    work = sum(
        size if scan_lexical and f.lang == lexical.LANG else size * _PARSE_COST
        for f, size in zip(ts_files, sizes.values(), strict=True)
    )
    if workers <= 1 or len(ts_files) < 2 or work < _PARALLEL_BYTES:
        workers = 1
    if stats is not None:
        stats.workers = workers
    total = len(ts_files)
    done = 0
    if workers == 1:
        batch = []
        for f in ts_files:
            batch.append((f.path, _read(str(root), f.path, f.lang, scan_lexical)))
            done += 1
            if progress and (done % 16 == 0 or done == total):
                progress(done, total)
        yield batch
        return
    # Largest files first, dealt round-robin into many chunks: balanced and early finishing.
    ordered = sorted(ts_files, key=lambda f: (-sizes[f.path], f.path))
    n_chunks = min(len(ordered), workers * 8)
    chunks: list[list[tuple[str, str]]] = [[] for _ in range(n_chunks)]
    for i, f in enumerate(ordered):
        chunks[i % n_chunks].append((f.path, f.lang))
    import multiprocessing

    context = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        jobs = pool.map(_read_chunk, [str(root)] * n_chunks, [scan_lexical] * n_chunks, chunks)
        for result in jobs:
            done += len(result)
            if progress:
                progress(done, total)
            yield result


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def fingerprint(files: list[SourceFile]) -> str:
    """One id for the exact set of (path, content, language) triples."""
    h = hashlib.sha1(_VERSION.encode())
    for f in files:
        h.update(f"{f.path}\0{f.content_id}\0{f.lang}\n".encode())
    return h.hexdigest()


def build_index(
    root: str | Path,
    *,
    cache: TagCache | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
) -> RepoIndex:
    """Scan ``root`` and make sure every source file's tags are in the cache."""
    root_path = Path(root)
    if not root_path.is_dir():
        raise ContextError(f"{root} is not a directory")
    cache = cache if cache is not None else TagCache()
    stats = IndexStats()
    t0 = time.perf_counter()
    files, skipped = scan(root_path, stats)
    stats.files = len(files)
    stats.scan_ms = (time.perf_counter() - t0) * 1000
    index = RepoIndex(root_path, files, cache, fingerprint(files), skipped, stats)
    graph_known = cache.has_graph(str(root_path.resolve()), index.fingerprint)
    if graph_known:
        # The graph for exactly these contents exists, so every graph input was cached.
        stats.cached = len(files)
        return index
    by_key: dict[str, list[SourceFile]] = {}
    for f in files:
        by_key.setdefault(_key(f), []).append(f)
    scanned = {k for k, group in by_key.items() if group[0].lang == lexical.LANG}
    cached = cache.existing(k for k in by_key if k not in scanned) | cache.existing_slims(scanned)
    # Identical contents (empty __init__.py files...) are read once.
    todo = [group[0] for k, group in by_key.items() if k not in cached]
    stats.cached = len(files) - sum(len(by_key[_key(f)]) for f in todo)
    # cached inputs stay on disk until someone asks (RepoIndex.slims, RepoIndex.payloads)
    if todo:
        t1 = time.perf_counter()
        key_of = {f.path: _key(f) for f in todo}
        # Each batch is stored and loaded while the pool reads the next one: this process
        # would otherwise wait idle, then do it all after the last file.
        for batch in _parse(
            root_path, todo, workers or default_workers(), progress, scan_lexical=True, stats=stats
        ):
            stats.parsed += len(batch)
            cache.put_many((key_of[p], data) for p, data in batch if key_of[p] not in scanned)
            cache.put_slims((key_of[p], data) for p, data in batch if key_of[p] in scanned)
            for path, data in batch:
                key = key_of[path]
                if key in scanned:
                    index._slims[key] = Slim._make(marshal.loads(data))
                else:
                    index._hold(data, by_key[key])
        stats.parse_ms = (time.perf_counter() - t1) * 1000
    return index
