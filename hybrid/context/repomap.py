"""Repo maps: the ranked files of a checkout with their key signatures, under a token budget."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from hybrid.context.cache import TagCache
from hybrid.context.graph import Graph, build_graph, patch_graph
from hybrid.context.grep import grep_words
from hybrid.context.history import recent_changes, similar_changes
from hybrid.context.index import Progress, RepoIndex, build_index, gc_paused
from hybrid.context.tags import FILE_KIND, qualified_signature
from hybrid.context.text import count_tokens
from hybrid.errors import ContextError
from hybrid.paths import printable

if TYPE_CHECKING:
    # numpy comes in with the ranking: a map served from the cache never needs it
    from hybrid.context.ranking import Mode, Ranking
    from hybrid.context.symbols import SymbolHit

_MAX_SIGNATURES_PER_FILE = 12
# Files whose tags are read (parsed, if not cached yet) at once while rendering: about as
# many as the budget left can show (an entry with its signatures takes ~120 tokens), at most
# 16, since a file parsed and not shown is wasted.
_PREFETCH = 16
_ENTRY_TOKENS = 120
_WIDTH = 100


class MapEntry(BaseModel):
    """One file of the map."""

    path: str
    score: float
    signatures: list[str] = Field(description="key definitions, most relevant first, in line order")
    reasons: list[str]


class RepoMap(BaseModel):
    """A ranked map of a repository under a token budget."""

    root: str
    task: str
    tokens: int = Field(description="tokens of `text` (hybrid.context.text.count_tokens)")
    budget: int
    files_total: int
    entries: list[MapEntry]
    text: str
    files_without_symbols: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(
        default_factory=list,
        description="source files left out and why ('path: reason'): a symlink, a FIFO, too large",
    )


@gc_paused()
def load_graph(
    root: str | Path,
    *,
    cache: TagCache | None = None,
    progress: Progress | None = None,
    index: RepoIndex | None = None,
) -> Graph:
    """The code graph of ``root``: loaded from the cache when nothing changed, else rebuilt."""
    cache = cache if cache is not None else TagCache()
    index = index if index is not None else build_index(root, cache=cache, progress=progress)
    if not index.files:
        raise ContextError(f"no source files to index under {root}")
    key = str(Path(root).resolve())
    recent = _recent
    if recent is not None and recent[:2] == (key, index.fingerprint):
        return replace(recent[2], index=index)
    stored = cache.get_graph(key, index.fingerprint)
    if stored is not None:
        loaded = Graph.from_data(stored, index)
        _remember(key, index.fingerprint, loaded)
        return loaded
    # Rebuild from per-file graph inputs stored by content key: only files never seen
    # before are read.
    keys = {f.path: TagCache.key(f.content_id, f.lang) for f in index.files}
    slims = index.slims
    graph: Graph | None = None
    if recent is not None and recent[0] == key:
        # The graph this process last saw of the repository (maybe older than the stored
        # one: patching any base gives the same graph) spares reading the stored one.
        graph = patch_graph(recent[2], keys, slims)
    if graph is None:
        last = cache.last_graph(key)
        graph = patch_graph(Graph.from_data(last), keys, slims) if last is not None else None
    if graph is None:
        got = slims(set(keys.values()))
        graph = build_graph({p: got[k] for p, k in keys.items() if k in got}, keys)
    cache.put_graph(key, index.fingerprint, graph.data())
    graph.index = index
    _remember(key, index.fingerprint, graph)
    return graph


_recent: tuple[str, str, Graph] | None = None
"""(root, fingerprint, graph): the graph this process last loaded or built. A resident server
worker serves the same repository again and again; one graph is kept, to bound memory."""


def _remember(root: str, fingerprint: str, graph: Graph) -> None:
    global _recent
    _recent = (root, fingerprint, graph)


def _symbol_lines(
    sym_index: dict[str, int],
    ranking: Ranking,
    index: RepoIndex,
    path: str,
    limit: int,
    hits: list[SymbolHit] | None = None,
) -> list[tuple[int, str]]:
    if hits:  # ranked for the task: the same symbols the pack's bodies hold
        return [(h.definition.line, qualified_signature(h.definition)) for h in hits[:limit]]
    try:
        tags = index.tags(path)
    except ContextError:
        return []
    scored = []
    for d in tags.definitions:
        if d.kind == "local":
            continue
        j = sym_index.get(d.qualified)
        s = float(ranking.symbol_score[j]) if j is not None else 0.0
        if d.name in ranking.task.symbols:
            s += 1.0
        if d.name.startswith("__") and d.name.endswith("__"):
            s *= 0.1
        if d.kind in ("class", "interface", "module"):
            s = s * 2 + 1e-6
        scored.append((-s, d.line, d))
    chosen = sorted(scored, key=lambda t: (t[0], t[1]))[:limit]
    return [(d.line, qualified_signature(d)) for _, _, d in chosen]  # most relevant first


def _wrap(line: int, signature: str) -> str:
    """``  120: def f(a, b,`` then continuation lines under the signature: never cut."""
    head = f"  {line:>5}: "
    pad = " " * len(head)
    out: list[str] = []
    current = head
    for word in signature.split(" "):
        if len(current) + len(word) + 1 > _WIDTH and current.strip() and current != head:
            out.append(current.rstrip())
            current = pad
        current += word + " "
    out.append(current.rstrip())
    return "\n".join(out) + "\n"


def _block(path: str, lines: list[tuple[int, str]]) -> str:
    """A file's map entry, its signatures in line order."""
    shown = printable(path)  # a name with a newline or an escape must not forge map lines
    if not lines:
        return shown + "\n"
    return shown + ":\n" + "".join(_wrap(n, sig) for n, sig in sorted(lines))


def render_map(
    graph: Graph,
    ranking: Ranking,
    tokens: int,
    *,
    exclude: set[str] | None = None,
    counter: Callable[[str], int] = count_tokens,
    hits: list[SymbolHit] | None = None,
) -> tuple[str, list[MapEntry]]:
    """Text of the map for ``ranking`` that fits in ``tokens`` (whole files or nothing).

    Files with ranked symbols (``hits``, see ``rank_symbols``) list those, best first."""
    hits_of: dict[str, list[SymbolHit]] = {}
    for h in hits or []:
        if h.definition.kind != FILE_KIND:  # the file itself, not a symbol to list
            hits_of.setdefault(h.path, []).append(h)
    index = graph.repo_index
    paths = graph.paths
    parts: list[str] = []
    entries: list[MapEntry] = []
    used = 0
    exclude = exclude or set()
    sym_index = {s: j for j, s in enumerate(graph.symbols)}
    loaded: set[str] = set()
    for k, i in enumerate(ranking.order):
        path = paths[i]
        if path in exclude:
            continue
        left = tokens - used
        if left < 4:
            break
        lines: list[tuple[int, str]] = []
        if left > 24:  # room for signatures: read this file's tags (batched, as far as needed)
            if path not in loaded:
                ahead = max(1, min(_PREFETCH, left // _ENTRY_TOKENS))
                batch = [paths[j] for j in ranking.order[k : k + ahead]]
                index.payloads(batch)
                loaded.update(batch)
            lines = _symbol_lines(
                sym_index, ranking, index, path, _MAX_SIGNATURES_PER_FILE, hits_of.get(path)
            )
        block = _block(path, lines)
        cost = counter(block)
        while lines and cost > left:  # drop the least relevant signatures until it fits
            lines = lines[:-1]
            block = _block(path, lines)
            cost = counter(block)
        if cost > left:
            continue
        parts.append(block)
        used += cost
        entries.append(
            MapEntry(
                path=path,
                score=round(float(ranking.score[i]), 6),
                signatures=[f"{n}: {sig}" for n, sig in sorted(lines)],
                reasons=ranking.reasons.get(i, []),
            )
        )
    return "".join(parts), entries


@gc_paused()
def repo_map(
    root: str | Path = ".",
    task: str = "",
    tokens: int = 2048,
    *,
    mode: Mode = "fused",
    cache: TagCache | None = None,
    progress: Progress | None = None,
) -> RepoMap:
    """Rank ``root``'s files for ``task`` and render the map within ``tokens``."""
    if tokens < 1:
        raise ContextError("the token budget must be positive")
    cache = cache if cache is not None else TagCache()
    index = build_index(root, cache=cache, progress=progress)
    # A map without a task is a function of the indexed contents alone, so it is kept by
    # their fingerprint; a task's map also reads history and the full text of files the index
    # does not hold, so it is always computed.
    stored_as = (str(Path(root).resolve()), f"{tokens}:{mode}", index.fingerprint)
    if not task:
        stored = cache.get_map(*stored_as)
        if stored is not None:
            # Skipped files are not in the fingerprint: a new symlink changes no indexed file.
            skipped = [f"{p}: {why}" for p, why in index.skipped]
            return RepoMap.model_validate_json(stored).model_copy(
                update={"root": str(root), "skipped": skipped}
            )
    from hybrid.context.ranking import rank
    from hybrid.context.symbols import rank_symbols, rerank_files

    graph = load_graph(root, cache=cache, index=index)
    history = recent_changes(root) if task else None
    grep = partial(grep_words, root) if task else None
    similar = similar_changes(root, task) if task else None
    ranking = rank(graph, task, mode, history, grep, similar)
    hits = rank_symbols(graph, ranking, root) if task else None
    if hits:
        ranking = rerank_files(graph, ranking, hits)
    text, entries = render_map(graph, ranking, tokens, hits=hits)
    made = RepoMap(
        root=str(root),
        task=task,
        tokens=count_tokens(text) if text else 0,
        budget=tokens,
        files_total=len(graph.paths),
        entries=entries,
        text=text,
        files_without_symbols=[p for p, n in zip(graph.paths, graph.ndefs, strict=False) if n == 0],
        skipped=[f"{p}: {why}" for p, why in index.skipped],
    )
    if not task:
        cache.put_map(*stored_as, made.model_dump_json())
    return made
