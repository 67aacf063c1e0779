"""Context packs: one token budget filled with what a model needs for a task.

In order of priority: the full text of the top-ranked files (or, when a file is too big,
the full bodies of its relevant symbols, else its skeleton), skeletons of their neighbours
(files they import and files importing them), the related test files, and the ranked map
of the rest. Every item says why it was chosen.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from hybrid.context.bodies import BodyPacker
from hybrid.context.cache import TagCache
from hybrid.context.graph import Graph, importers
from hybrid.context.grep import grep_words
from hybrid.context.history import recent_changes, similar_changes
from hybrid.context.index import Progress, RepoIndex
from hybrid.context.ranking import Mode, Ranking, rank
from hybrid.context.repomap import load_graph, render_map
from hybrid.context.resolve import is_test_path
from hybrid.context.skeletons import skeleton_source
from hybrid.context.symbols import SymbolHit, rank_symbols, rerank_files
from hybrid.context.tags import Definition
from hybrid.context.text import count_tokens, name_terms
from hybrid.errors import ContextError
from hybrid.paths import printable
from hybrid.repofs import Refused, read_file

PRIMARY_FILES = 3
PRIMARY_SHARE = 0.55
BODY_SHARE = 0.8
NEIGHBOUR_SHARE = 0.15
TEST_SHARE = 0.10
MAP_MIN_SHARE = 0.15

ItemKind = Literal["map", "file", "symbols", "skeleton", "test"]


class PackItem(BaseModel):
    """One piece of the pack."""

    kind: ItemKind
    path: str | None = None
    reason: str = Field(description="why this item was chosen")
    tokens: int
    text: str
    spans: list[tuple[int, int]] = Field(
        default_factory=list,
        description="1-based line ranges of the file whose full text (bodies) the item holds",
    )


class ContextPack(BaseModel):
    """Everything chosen for one task, within one budget."""

    root: str
    task: str
    budget: int
    tokens: int = Field(description="sum of the items' tokens; never above budget")
    items: list[PackItem]
    ranking: list[str] = Field(description="the top twenty files, best first")
    skipped: list[str] = Field(
        default_factory=list,
        description="source files left out and why ('path: reason'): a symlink, a FIFO, too large",
    )


def _read(root: Path, path: str) -> bytes | None:
    try:
        return read_file(root, path)
    except Refused:
        return None


def _symbol_bodies(
    index: RepoIndex, root: Path, path: str, wanted: dict[str, float], budget: int
) -> tuple[str, list[str], list[tuple[int, int]]]:
    """Full bodies of the file's definitions that the task is about, best first."""
    data = _read(root, path)
    if data is None:
        return "", [], []
    lines = data.decode("utf-8", "replace").splitlines()
    tags = index.tags(path)
    picked = [d for d in tags.definitions if d.name in wanted and d.kind != "local"]
    picked.sort(key=lambda d: (-wanted[d.name], d.line))
    out: list[str] = []
    names: list[str] = []
    used = 0
    covered: list[tuple[int, int]] = []
    for d in picked:
        if any(a <= d.line and d.end_line <= b for a, b in covered):
            continue
        block = (
            f"# {printable(path)}:{d.line}-{d.end_line}\n"
            + "\n".join(lines[d.line - 1 : d.end_line])
            + "\n"
        )
        cost = count_tokens(block)
        if used + cost > budget:
            continue
        out.append(block)
        names.append(d.name)
        covered.append((d.line, d.end_line))
        used += cost
    return "".join(out), names, covered


def _skeleton_item(
    root: Path,
    path: str,
    lang: str,
    kind: ItemKind,
    reason: str,
    budget: int,
    truncate: bool = False,
) -> PackItem | None:
    """A file's skeleton as a pack item, if it fits (or, with ``truncate``, its first lines)."""
    data = _read(root, path)
    if data is None or lang.startswith("ctags:") or budget < 16:
        return None
    try:
        text = f"# {printable(path)} (skeleton)\n" + skeleton_source(data, lang)
    except ContextError:
        return None
    cost = count_tokens(text)
    if cost > budget and truncate:
        lines = text.splitlines(keepends=True)
        marker = "# ... (truncated)\n"
        while lines and count_tokens("".join(lines) + marker) > budget:
            lines = lines[: max(1, len(lines) * 3 // 4)] if len(lines) > 8 else lines[:-1]
        text = "".join(lines) + marker
        cost = count_tokens(text)
        reason += "; skeleton truncated to fit"
    if cost > budget or not text.strip():
        return None
    return PackItem(kind=kind, path=path, reason=reason, tokens=cost, text=text)


def context_pack(
    root: str | Path = ".",
    task: str = "",
    tokens: int = 8000,
    *,
    mode: Mode = "fused",
    cache: TagCache | None = None,
    progress: Progress | None = None,
) -> ContextPack:
    """Fill ``tokens`` with the context for ``task`` in the checkout at ``root``."""
    if not task.strip():
        raise ContextError("a context pack needs a task (--task)")
    if tokens < 64:
        raise ContextError("the token budget must be at least 64")
    root_path = Path(root)
    graph = load_graph(root_path, cache=cache, progress=progress)
    history, similar = recent_changes(root_path), similar_changes(root_path, task)
    ranking = rank(graph, task, mode, history, partial(grep_words, root_path), similar)
    return fill_pack(graph, ranking, root_path, task, tokens)


def _ranked_bodies(
    graph: Graph, ranking: Ranking, root: Path, hits: list[SymbolHit], budget: int
) -> tuple[list[PackItem], list[int], int]:
    """Bodies of the best symbols, in symbol order across files, grouped per file."""
    index = graph.repo_index
    paths: list[str] = graph.paths
    langs = {paths[h.file]: graph.langs[h.file] for h in hits}
    packer = BodyPacker(root, langs, budget)
    defs_of: dict[str, list[Definition]] = {}
    for hit in packer.packing(hits):
        if budget - packer.used < 24:
            break
        if hit.path not in defs_of:
            defs_of[hit.path] = list(index.tags(hit.path).definitions)
        packer.add(hit, defs_of[hit.path])
    file_of = {h.path: h.file for h in hits}
    items: list[PackItem] = []
    used = 0
    for path, text, spans, names, whole in packer.result():
        i = file_of[path]
        rank_no = ranking.order.index(i) + 1
        why = "; ".join(ranking.reasons.get(i, [])) or "ranked"
        what = "whole file" if whole else "bodies of " + ", ".join(names[:8])
        cost = count_tokens(text)
        items.append(
            PackItem(
                kind="file" if whole else "symbols",
                path=path,
                reason=f"file rank {rank_no}: {why}; {what}",
                tokens=cost,
                text=text,
                spans=spans,
            )
        )
        used += cost
    return items, [file_of[p] for p in packer.order], used


def _primary_files(
    graph: Graph,
    ranking: Ranking,
    root_path: Path,
    tokens: int,
    map_reserve: int,
    primary_budget: int,
) -> tuple[list[PackItem], list[int], int]:
    """The file-first pack: the top files whole, else their matching symbols' bodies."""
    index = graph.repo_index
    paths: list[str] = graph.paths
    langs: list[str] = graph.langs
    sym_index = {s: j for j, s in enumerate(graph.symbols)}
    items: list[PackItem] = []
    used = 0
    # 1. primary files: full text, else the relevant symbols' bodies, else a skeleton
    primary: list[int] = [i for i in ranking.order if not graph.tests[i]][:PRIMARY_FILES]
    included: list[int] = []
    for rank_no, i in enumerate(primary, 1):
        path = paths[i]
        why = "; ".join(ranking.reasons.get(i, [])) or "ranked"
        reason = f"rank {rank_no}: {why}"
        left = primary_budget - used
        # a full file may take what is left; partial content leaves room for the others
        share = left if rank_no == len(primary) else int(left * 0.6)
        room = min(left, tokens - map_reserve - used)
        data = _read(root_path, path)
        if data is None or room <= 0:
            continue
        text = f"# {printable(path)}\n" + data.decode("utf-8", "replace")
        cost = count_tokens(text)
        if cost <= room:
            n_lines = max(1, text.count("\n"))
            items.append(
                PackItem(
                    kind="file",
                    path=path,
                    reason=reason,
                    tokens=cost,
                    text=text,
                    spans=[(1, n_lines)],
                )
            )
            used += cost
            included.append(i)
            continue
        room = min(room, share)
        # mentioned symbols first, then names sharing words with the task, then graph rank
        wanted = {name: 2.0 + w for name, w in ranking.task.symbols.items()}
        task_terms = set(ranking.task.terms)
        for d in index.tags(path).definitions:
            j = sym_index.get(d.qualified)
            if j is not None and d.name not in wanted and not d.name.startswith("__"):
                overlap = len(task_terms.intersection(name_terms(d.name)))
                wanted[d.name] = 0.5 * overlap + float(ranking.symbol_score[j])
        body, names, spans = _symbol_bodies(index, root_path, path, wanted, room)
        if body:
            cost = count_tokens(body)
            items.append(
                PackItem(
                    kind="symbols",
                    path=path,
                    reason=f"{reason}; file too large, bodies of {', '.join(names[:8])}",
                    tokens=cost,
                    text=body,
                    spans=spans,
                )
            )
            used += cost
            included.append(i)
            continue
        item = _skeleton_item(
            root_path, path, langs[i], "skeleton", f"{reason}; file too large", room
        )
        if item:
            items.append(item)
            used += item.tokens
            included.append(i)
    return items, included, used


def fill_pack(
    graph: Graph,
    ranking: Ranking,
    root_path: Path,
    task: str,
    tokens: int,
    *,
    symbols: bool = True,
    ablate: frozenset[str] = frozenset(),
    hits: list[SymbolHit] | None = None,
) -> ContextPack:
    """Fill ``tokens`` for an already ranked graph (so one ranking serves many budgets).

    With ``symbols`` (the default) the bodies of the best-ranked symbols fill the body
    budget across files; without it, the top files go in whole or by their matching
    symbols (the earlier, file-first pack). ``ablate`` leaves symbol signals out;
    ``hits`` (from ``rank_symbols``) saves ranking the symbols again for another budget.
    """
    paths: list[str] = graph.paths
    langs: list[str] = graph.langs
    items: list[PackItem] = []
    map_reserve = max(32, int(tokens * MAP_MIN_SHARE))
    if not symbols:
        hits = []
    elif hits is None:
        hits = rank_symbols(graph, ranking, root_path, ablate=ablate)
    if symbols:
        ranking = rerank_files(graph, ranking, hits)
        primary_budget = min(int(tokens * BODY_SHARE), tokens - map_reserve)
        items, primary, used = _ranked_bodies(graph, ranking, root_path, hits, primary_budget)
    else:
        primary_budget = int(tokens * PRIMARY_SHARE)
        items, primary, used = _primary_files(
            graph, ranking, root_path, tokens, map_reserve, primary_budget
        )

    # 2. neighbours: what the primary files import and what imports them
    reverse = importers(graph)
    chosen = {paths[i] for i in primary}
    neighbour_ids: dict[int, str] = {}
    for i in primary:
        for t in graph.imports[i]:
            neighbour_ids.setdefault(t, f"imported by {paths[i]}")
        for s in reverse[i]:
            neighbour_ids.setdefault(s, f"imports {paths[i]}")
    position = {f: k for k, f in enumerate(ranking.order)}
    neighbour_budget = int(tokens * NEIGHBOUR_SHARE) + max(0, primary_budget - used)
    spent = 0
    for t in sorted(neighbour_ids, key=lambda f: position[f]):
        if paths[t] in chosen or graph.tests[t]:
            continue
        room = min(neighbour_budget - spent, tokens - map_reserve - used)
        item = _skeleton_item(root_path, paths[t], langs[t], "skeleton", neighbour_ids[t], room)
        if item:
            items.append(item)
            used += item.tokens
            spent += item.tokens
            chosen.add(paths[t])

    # 3. related tests: test files that import a primary file or are named after one
    stems = {
        paths[i].rsplit("/", 1)[-1].rsplit(".", 1)[0]: (n, paths[i]) for n, i in enumerate(primary)
    }
    related: dict[int, tuple[int, int, str]] = {}  # test -> (primary rank, named?, reason)
    for n, i in enumerate(primary):
        for s in reverse[i]:
            if graph.tests[s] and s not in related:
                related[s] = (n, 1, f"tests {paths[i]} (imports it)")
    for k, path in enumerate(paths):
        if graph.tests[k] and is_test_path(path):
            name = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
            for stem, (n, src) in stems.items():
                if name in (f"test_{stem}", f"{stem}_test", f"{stem}.test", f"{stem}.spec"):
                    related[k] = (n, 0, f"tests {src} (named after it)")
    test_budget = int(tokens * TEST_SHARE) + max(0, neighbour_budget - spent)
    spent = 0
    # tests of the best file first; for each, the one named after it before importers
    for t in sorted(related, key=lambda f: (related[f][0], related[f][1], position[f])):
        room = min(test_budget - spent, tokens - map_reserve - used)
        item = _skeleton_item(
            root_path, paths[t], langs[t], "test", related[t][2], room, truncate=True
        )
        if item:
            items.append(item)
            used += item.tokens
            spent += item.tokens
            chosen.add(paths[t])

    # 4. the map of everything else, with all the budget left
    # files packed in part stay on the map, led by the symbols whose bodies were packed
    whole = {item.path for item in items if item.kind != "symbols" and item.path}
    map_text, entries = render_map(graph, ranking, tokens - used, exclude=whole, hits=hits)
    if map_text:
        cost = count_tokens(map_text)
        items.insert(
            0,
            PackItem(
                kind="map",
                reason=f"ranked map of {len(entries)} more files for orientation",
                tokens=cost,
                text=map_text,
            ),
        )
        used += cost
    return ContextPack(
        root=str(root_path),
        task=task,
        budget=tokens,
        tokens=used,
        items=items,
        ranking=[paths[i] for i in ranking.order[:20]],
        skipped=[f"{p}: {why}" for p, why in graph.repo_index.skipped],
    )
