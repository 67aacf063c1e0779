"""Fit the symbol ranking and body packing constants on a training set of fix commits.

    PYTHONPATH=. python benchmarks/fit_symbols.py REPO... [--chunk 20:60 ...] [--store DIR]

The sibling of ``fit_ranking.py``, for the second half of a pack: which symbols of the
candidate files get their bodies first. For each mined fix commit of a ``--chunk``
(SKIP:LIMIT: after the newest SKIP, which are the benchmark), at its parent: the file ranking (fixed here), every
signal of every definition of the best ``MAX_FILES`` non-test files (``symbol_signals``),
what the packer needs to price each body (per-line sizes, each file's frame, the class
fields and imports that come with a body) and the fix's hunks. A trial point then scores
the symbols again in numpy and replays a simplified ``BodyPacker`` (costs counted per line
instead of rendering text) to find which hunks the bodies cover at 4k and 8k tokens. The
script checks both against the real code at the current constants: the recomputed
scores against ``score_symbols`` and the replay's covered tasks against ``_ranked_bodies``.

The search is coordinate ascent on task recall at 4k and 8k (hunk recall breaks ties);
a step is kept only when it helps all four halves of two splits (by commit hash, by
repository). ``CANDIDATE_FILES`` is a knob too: a smaller candidate set is the larger one
with the other files' symbols left out (BM25 statistics recomputed). Extracted cases are
kept in ``--store`` so a second search need not rebuild them.
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
from fit_ranking import at_parents, climb  # the sibling script, beside this one

from hybrid.context import bodies as P
from hybrid.context import pack as K
from hybrid.context import symbols as S
from hybrid.context.bodies import BodyPacker, frame_lines
from hybrid.context.cache import TagCache
from hybrid.context.evaluation import EvalCase, covered_hunks, fix_hunks, source_hunks
from hybrid.context.graph import Graph
from hybrid.context.grep import grep_words
from hybrid.context.history import recent_changes, similar_changes
from hybrid.context.ranking import rank
from hybrid.context.tags import Definition
from hybrid.context.text import count_tokens, name_terms

MAX_FILES = 12  # signals are taken for this many files; CANDIDATE_FILES searches up to it
FIT_BUDGETS = (4000, 8000)
ALL_BUDGETS = (2000, 4000, 8000, 16000)
FITTED = (
    "CANDIDATE_FILES",
    "W_FILE",
    "W_NAME",
    "W_TEXT",
    "W_GRAPH",
    "W_TESTS",
    "W_HISTORY",
    "W_SIMILAR",
    "B",
    "K1",
    "DUNDER",
    "SIZE_PENALTY",
    "SIZE_FLOOR",
    "FRAME_SHARE",
    "FIRST_FILE_SHARE",
    "SMALL_FILE_SHARE",
)


@dataclass
class File:
    """What the replayed packer needs of one candidate file."""

    chars: np.ndarray  # per 1-based line (0 unused): its characters with the newline
    blank: np.ndarray  # bool per line
    frame: np.ndarray  # bool per line: the file's frame
    lean: np.ndarray  # ... without comments and docstrings
    whole: int  # tokens of the whole file
    header: int  # characters of "# path\n"


@dataclass
class Case:
    """The symbol signals of one training case, one row per candidate definition."""

    repo: str
    commit: str
    files: list[File]
    file_of: np.ndarray  # candidate -> position of its file in the ranking (0..MAX_FILES-1)
    start: np.ndarray  # first line with its doc comment and decorators
    end: np.ndarray
    cost: np.ndarray  # tokens of the body
    large: np.ndarray  # a container with members (packed by its methods when too big)
    dunder: np.ndarray  # a __dunder__ the task does not name
    tiebreak: np.ndarray  # position in (path, line, name) order
    file_score: np.ndarray
    mention: np.ndarray  # the name signal's part from names the task mentions
    overlap: np.ndarray  # candidate x task term: the name has the term
    tf: np.ndarray  # candidate x task term: occurrences in the body
    length: np.ndarray  # terms in the body
    edges: np.ndarray  # (caller, callee, cross-file?) rows
    tests: np.ndarray
    history: np.ndarray  # log1p of recent changes to the body (not normalized)
    similar: np.ndarray  # log1p of lines past commits like the task added (not normalized)
    extra: list[np.ndarray]  # lines shown with a body when its file's frame is not
    hunks: list[tuple[int, int, int]]  # (file position or -1, first line, last line)
    real: dict[int, int]  # hunks the real packer covers at the current constants
    real_score: np.ndarray  # score_symbols at the current constants (nan: not a candidate)


def current() -> dict[str, float]:
    return {
        "CANDIDATE_FILES": S.CANDIDATE_FILES,
        "W_FILE": S.W_FILE,
        "W_NAME": S.W_NAME,
        "W_TEXT": S.W_TEXT,
        "W_GRAPH": S.W_GRAPH,
        "W_TESTS": S.W_TESTS,
        "W_HISTORY": S.W_HISTORY,
        "W_SIMILAR": S.W_SIMILAR,
        "B": S.B,
        "K1": S.K1,
        "DUNDER": S.DUNDER,
        "SIZE_PENALTY": P.SIZE_PENALTY,
        "SIZE_FLOOR": P.SIZE_FLOOR,
        "FRAME_SHARE": P.FRAME_SHARE,
        "FIRST_FILE_SHARE": P.FIRST_FILE_SHARE,
        "SMALL_FILE_SHARE": P.SMALL_FILE_SHARE,
    }


# ----------------------------------------------------------------------------- extraction


def extract(repo: Path, skip: int, limit: int, cache: TagCache) -> list[Case]:
    found = (_case(repo, *at) for at in at_parents(repo, skip, limit, cache))
    return [case for case in found if case is not None]


def _file(path: str, lines: list[str], defs: list[Definition]) -> File:
    n = len(lines)
    chars = np.zeros(n + 1, dtype=np.int64)
    chars[1:] = [len(x) + 1 for x in lines]
    blank = np.zeros(n + 1, dtype=bool)
    blank[1:] = [not x.strip() for x in lines]
    return File(
        chars=chars,
        blank=blank,
        frame=np.array(frame_lines(lines, defs, False), dtype=bool),
        lean=np.array(frame_lines(lines, defs, True), dtype=bool),
        whole=count_tokens(f"# {path}\n" + "\n".join(lines) + "\n"),
        header=len(f"# {path}\n"),
    )


def _case(repo: Path, case: EvalCase, graph: Graph, worktree: Path) -> Case | None:
    hunks = source_hunks(graph, fix_hunks(repo, case))
    if not hunks:
        return None  # not scored by the eval either
    paths = graph.paths
    history, similar = recent_changes(worktree), similar_changes(worktree, case.task)
    ranking = rank(graph, case.task, "fused", history, partial(grep_words, worktree), similar)
    top = [i for i in ranking.order if not graph.tests[i]]
    sig = S.symbol_signals(graph, ranking, worktree, files=top[:MAX_FILES])
    # the default candidate set's own run: its history signal (the last commits touching
    # fewer files differ), its normalization of the similar signal and the real packer's
    # coverage
    ablate = frozenset() if S.W_SIMILAR else frozenset({"similar"})
    base = S.symbol_signals(graph, ranking, worktree, ablate=ablate)
    pos = {i: k for k, i in enumerate(top[:MAX_FILES])}
    index = graph.repo_index
    terms = sorted(set(ranking.task.terms))
    n = len(sig.cands)
    files: dict[int, File] = {}
    lines_of: dict[int, list[str]] = {}
    defs_of: dict[int, list[Definition]] = {}
    for i, _d, _s in sig.cands:
        if pos[i] not in files:
            lines = (worktree / paths[i]).read_text("utf-8", "replace").splitlines()
            defs = list(index.tags(paths[i]).definitions)
            lines_of[pos[i]], defs_of[pos[i]] = lines, defs
            files[pos[i]] = _file(paths[i], lines, defs)
    packer = BodyPacker(worktree, {}, 1)
    base_hist = {(c[0], c[1]): h for c, h in zip(base.cands, base.history, strict=True)}
    base_sim = {(c[0], c[1]): h for c, h in zip(base.cands, base.similar, strict=True)}
    mentioned = sig.mentioned
    file_of = np.array([pos[c[0]] for c in sig.cands], dtype=np.int64)
    start = np.array([c[2] for c in sig.cands], dtype=np.int64)
    end = np.array([c[1].end_line for c in sig.cands], dtype=np.int64)
    cost = np.zeros(n, dtype=np.int64)
    large = np.zeros(n, dtype=bool)
    dunder = np.zeros(n, dtype=bool)
    mention = np.zeros(n)
    overlap = np.zeros((n, len(terms)))
    tf = np.zeros((n, len(terms)))
    history = np.zeros(n)
    similar = np.zeros(n)
    extra: list[np.ndarray] = []
    term_pos = {t: k for k, t in enumerate(terms)}
    for k, (i, d, first) in enumerate(sig.cands):
        f = pos[i]
        lines = lines_of[f]
        body = "\n".join(lines[first - 1 : d.end_line])
        cost[k] = count_tokens(body)
        large[k] = d.kind in P._CONTAINERS and packer._has_members(d, defs_of[f])
        dunder[k] = d.name.startswith("__") and d.name.endswith("__") and d.name not in mentioned
        score = mentioned.get(d.name, 0.0) * 2.0
        if score and d.scope and d.scope.rsplit(".", 1)[-1] in mentioned:
            score += 1.0
        mention[k] = score
        for t in set(name_terms(d.name)) & set(terms):
            overlap[k, term_pos[t]] = 1.0
        for t, c in sig.terms[k].items():
            tf[k, term_pos[t]] = c
        # history: the default run's (normalized there) where it has the symbol
        history[k] = base_hist.get((i, d), sig.history[k])
        similar[k] = base_sim.get((i, d), sig.similar[k]) if S.W_SIMILAR else sig.similar[k]
        extra.append(
            _unframed(packer, files[f], lines, d, defs_of[f], body, paths[i], graph.langs[i])
        )
    edges = [
        (k, j, int(file_of[k] != file_of[j]))
        for k, targets in enumerate(sig.calls)
        for j in targets
    ]
    order = sorted(
        range(n), key=lambda k: (paths[sig.cands[k][0]], sig.cands[k][1].line, sig.cands[k][1].name)
    )
    tiebreak = np.empty(n, dtype=np.int64)
    tiebreak[order] = np.arange(n)
    hunk_rows = [
        (pos.get(paths.index(h.path), -1) if h.path in paths else -1, *h.lines) for h in hunks
    ]
    hits = S.score_symbols(base)
    by_def = {(h.file, h.definition): h.score for h in hits}
    real_score = np.array([by_def.get((i, d), np.nan) for i, d, _s in sig.cands])
    ranked = S.rerank_files(graph, ranking, hits)
    real = {}
    for b in ALL_BUDGETS:
        budget = min(int(b * K.BODY_SHARE), b - max(32, int(b * K.MAP_MIN_SHARE)))
        items, _, used = K._ranked_bodies(graph, ranked, worktree, hits, budget)
        pack = K.ContextPack(root="", task="", budget=b, tokens=used, items=items, ranking=[])
        real[b] = covered_hunks(pack, hunks)
    return Case(
        repo=repo.name,
        commit=case.commit,
        # a file without candidates holds no hunk the bodies could cover: never read
        files=[files.get(f) for f in range(max(files) + 1)] if files else [],  # type: ignore[misc]
        file_of=file_of,
        start=start,
        end=end,
        cost=cost,
        large=large,
        dunder=dunder,
        tiebreak=tiebreak,
        file_score=np.array(sig.file),
        mention=mention,
        overlap=overlap,
        tf=tf,
        length=np.array(sig.lengths, dtype=float),
        edges=np.array(edges, dtype=np.int64).reshape(-1, 3),
        tests=np.array(sig.tests),
        history=history,
        similar=similar,
        extra=extra,
        hunks=hunk_rows,
        real=real,
        real_score=real_score,
    )


def _unframed(
    packer: BodyPacker,
    f: File,
    lines: list[str],
    d: Definition,
    defs: list[Definition],
    body: str,
    path: str,
    lang: str,
) -> np.ndarray:
    """Lines ``BodyPacker.add`` shows with a body when its file's frame is not shown: the
    enclosing class's fields (else its header) and the imports the body uses."""
    shown = [False] * (len(lines) + 1)
    held = P._File(path, lang, lines, P.import_statements(lines, lang), shown)
    cls = packer._enclosing(d, defs)
    if cls is not None:
        fields = [cls.line <= n <= cls.end_line and bool(f.lean[n]) for n in range(len(shown))]
        cost = sum(count_tokens(lines[n - 1] + "\n") for n in range(1, len(shown)) if fields[n])
        if cost <= P.CLASS_MAX_TOKENS:
            shown[:] = [x or y for x, y in zip(shown, fields, strict=True)]
        else:
            P._mark(shown, cls.line, cls.line + len(P._header_lines(held, cls)) - 1)
    packer._imports_for(held, body, shown)
    return np.nonzero(np.array(shown, dtype=bool))[0]


# ----------------------------------------------------------------------------- replay


def scores(c: Case, p: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """The candidates of the first ``CANDIDATE_FILES`` files and their ``score_symbols``
    scores at ``p``."""
    sel = np.nonzero(c.file_of < int(p["CANDIDATE_FILES"]))[0]
    n = sel.size
    if not n:
        return sel, np.zeros(0)
    tf, length = c.tf[sel], c.length[sel]
    avg = length.sum() / n or 1.0
    df = (tf > 0).sum(axis=0)
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
    norm = p["K1"] * (1 - p["B"] + p["B"] * length / avg)
    # only the terms a body has, as symbol_signals (an empty body would divide 0 by 0)
    part = idf * tf * (p["K1"] + 1) / np.where(tf > 0, tf + norm[:, None], 1.0)
    text = part.sum(axis=1)
    name = c.mention[sel] + (c.overlap[sel] @ idf) / 2
    base = (
        p["W_FILE"] * c.file_score[sel]
        + p["W_TEXT"] * text / (text.max() or 1.0)
        + p["W_NAME"] * name / (name.max() or 1.0)
    )
    local = np.full(c.file_of.size, -1)
    local[sel] = np.arange(n)
    e = c.edges
    if e.size:
        e = e[(local[e[:, 0]] >= 0) & (local[e[:, 1]] >= 0)]
    caller, callee = np.zeros(n), np.zeros(n)
    if e.size:
        src, dst = local[e[:, 0]], local[e[:, 1]]
        np.maximum.at(caller, dst, base[src])
        np.maximum.at(callee, src, base[dst])
    hist = c.history[sel]
    sim = c.similar[sel]
    score = (
        base
        + p["W_GRAPH"] * (caller + callee) / 2
        + p["W_TESTS"] * c.tests[sel]
        + p["W_HISTORY"] * hist / (hist.max() or 1.0)
        + p["W_SIMILAR"] * sim / (sim.max() or 1.0)
    )
    score = np.where(c.dunder[sel], score * p["DUNDER"], score)
    return sel, np.round(score, 9)


def packing(c: Case, p: dict[str, float]) -> np.ndarray:
    """Candidates in the order the packer tries them (``packing_order`` of the hits)."""
    sel, score = scores(c, p)
    hit_order = sel[np.lexsort((c.tiebreak[sel], -score))]
    by_sel = dict(zip(sel.tolist(), score.tolist(), strict=True))
    floor = p["SIZE_FLOOR"]
    size = np.log2(np.maximum(c.cost[hit_order], floor) / floor)
    key = np.array([by_sel[k] for k in hit_order.tolist()]) - p["SIZE_PENALTY"] * size
    return hit_order[np.lexsort((np.arange(key.size), -np.round(key, 9)))]


def _tokens(f: File, shown: np.ndarray) -> int:
    """``count_tokens`` of the file rendered with ``shown`` lines (a ``⋮`` per gap)."""
    gaps = int(np.count_nonzero(~shown[1:] & np.concatenate(([True], shown[1:-1]))))
    chars = f.header + int(f.chars[shown].sum()) + 4 * gaps
    return max((chars + 3) // 4, int(np.count_nonzero(shown[1:])) + gaps + 1)


def replay(c: Case, order: np.ndarray, budget: int, p: dict[str, float]) -> int:
    """Hunks covered by ``BodyPacker`` filling ``budget`` in ``order`` (simplified)."""
    shown: dict[int, np.ndarray] = {}
    whole: set[int] = set()
    framed: set[int] = set()
    placed: list[int] = []
    used = 0
    for k in order.tolist():
        if budget - used < 24:
            break
        fi = int(c.file_of[k])
        f = c.files[fi]
        a, b = int(c.start[k]), int(c.end[k])
        now = shown.get(fi)
        if fi in whole or (now is not None and now[a : b + 1].all()):
            continue
        share = p["FIRST_FILE_SHARE"] if not placed or placed == [fi] else p["SMALL_FILE_SHARE"]
        before = _tokens(f, now) if fi in placed and now is not None else 0
        if f.whole <= max(64, int(budget * share)) and used - before + f.whole <= budget:
            used += f.whole - before
            whole.add(fi)
            if fi not in placed:
                placed.append(fi)
            continue
        if c.large[k] and c.cost[k] > P.CLASS_MAX_TOKENS:
            continue
        span = f.chars[a : b + 1] if now is None else f.chars[a : b + 1][~now[a : b + 1]]
        if int(span.sum()) // 4 - 3 > budget - used:
            continue  # the body's new lines alone do not fit (a gap closed saves little)
        new = now.copy() if now is not None else np.zeros(f.chars.size, dtype=bool)
        new[a : min(b, f.chars.size - 1) + 1] = True
        is_framed = fi in framed
        if not is_framed:
            for frame in (f.frame, f.lean):
                with_frame = new | frame
                if _tokens(f, with_frame) - before - c.cost[k] <= budget * p["FRAME_SHARE"]:
                    new, is_framed = with_frame, True
                    break
        if not is_framed:
            new[c.extra[k]] = True
        cost = _tokens(f, new) - before
        if used + cost > budget:
            continue
        used += cost
        shown[fi] = new
        if is_framed:
            framed.add(fi)
        if fi not in placed:
            placed.append(fi)
    covered = 0
    for fi, lo, hi in c.hunks:
        if fi < 0 or fi not in placed:
            continue
        if fi in whole:
            covered += 1
            continue
        held = shown[fi]
        last = held.size - 1
        for n in range(max(1, lo), min(hi, last) + 1):
            m = n
            while m > 1 and c.files[fi].blank[m] and not held[m]:
                m -= 1  # a blank line joins the run of held lines above it
            if held[n] or (c.files[fi].blank[n] and held[m]):
                covered += 1
                break
    return covered


def outcomes(c: Case, p: dict[str, float], budgets: tuple[int, ...]) -> dict[int, int]:
    order = packing(c, p)
    return {
        b: replay(c, order, min(int(b * K.BODY_SHARE), b - max(32, int(b * K.MAP_MIN_SHARE))), p)
        for b in budgets
    }


def per_case(
    cases: list[Case], p: dict[str, float], budgets: tuple[int, ...] = FIT_BUDGETS
) -> list[dict[int, int]]:
    return [outcomes(c, p, budgets) for c in cases]


def metrics(
    cases: list[Case], got: list[dict[int, int]], budgets: tuple[int, ...] = FIT_BUDGETS
) -> dict[str, float]:
    """Task and hunk recall of ``cases`` from their outcomes ``got``."""
    hunks = sum(len(c.hunks) for c in cases) or 1
    out: dict[str, float] = {}
    for b in budgets:
        full = sum(g[b] == len(c.hunks) for g, c in zip(got, cases, strict=True))
        out[f"task{b}"] = full / (len(cases) or 1)
        out[f"hunk{b}"] = sum(g[b] for g in got) / hunks
    return out


def objective(m: dict[str, float]) -> float:
    return sum(m[f"task{b}"] + 0.1 * m[f"hunk{b}"] for b in FIT_BUDGETS)


def halves(cases: list[Case]) -> list[list[int]]:
    """Case numbers of two splits in halves: by commit hash, by repository."""
    repos = sorted({c.repo for c in cases})
    first = set(repos[::2])
    by_hash = [int(c.commit[:8], 16) % 2 for c in cases]
    return [
        [k for k, h in enumerate(by_hash) if h == 0],
        [k for k, h in enumerate(by_hash) if h == 1],
        [k for k, c in enumerate(cases) if c.repo in first],
        [k for k, c in enumerate(cases) if c.repo not in first],
    ]


def _objectives(cases: list[Case], parts: list[list[int]], p: dict[str, float]) -> list[float]:
    got = per_case(cases, p)
    return [objective(metrics([cases[k] for k in h], [got[k] for k in h])) for h in parts]


def _trials(key: str, v: float) -> set[float]:
    if key == "CANDIDATE_FILES":
        return {x for x in (5, 6, 7, 8, 9, 10, 12) if x <= MAX_FILES}
    if key == "SIZE_FLOOR":
        return {25, 50, 100, 200, 400}
    trials = {round(v * f, 4) for f in (0, 0.5, 0.7, 0.85, 1.2, 1.4, 2.0)}
    if v == 0:
        trials |= {0.1, 0.2, 0.4, 0.8}
    if key in ("B", "DUNDER", "FRAME_SHARE", "FIRST_FILE_SHARE", "SMALL_FILE_SHARE"):
        trials = {t for t in trials if 0 <= t <= 1.0} | {1.0}
    if key == "K1":
        trials -= {0.0}
    return trials


def ascend(cases: list[Case], start: dict[str, float], sweeps: int = 3) -> dict[str, float]:
    return climb(start, FITTED, _trials, partial(_objectives, cases, halves(cases)), sweeps)


def _check(cases: list[Case], start: dict[str, float]) -> None:
    """How closely the replay follows the real packer at the current constants."""
    off = 0
    for c in cases:
        sel, score = scores(c, start)
        want = c.real_score[sel]
        off += int(np.isnan(want).any() or not np.allclose(score, want, atol=1e-6))
    print(f"{len(cases)} cases; recomputed symbol scores differ from score_symbols in {off}")
    agree = {b: 0 for b in ALL_BUDGETS}
    for c in cases:
        got = outcomes(c, start, ALL_BUDGETS)
        for b in ALL_BUDGETS:
            agree[b] += (got[b] == len(c.hunks)) == (c.real[b] == len(c.hunks))
    real = {b: sum(c.real[b] == len(c.hunks) for c in cases) / len(cases) for b in ALL_BUDGETS}
    print(
        "replay agrees with the real packer on covered tasks: "
        + " ".join(f"{b}: {agree[b] / len(cases):.3f}" for b in ALL_BUDGETS)
    )
    print("real task recall: " + " ".join(f"{b}: {real[b]:.3f}" for b in ALL_BUDGETS))


def _load(repo: Path, skip: int, limit: int, store: Path, cache: TagCache) -> list[Case]:
    path = store / f"{repo.name}.{skip}.{limit}.pkl"
    if path.exists():
        with path.open("rb") as fh:
            return pickle.load(fh)  # our own file, written below
    got = extract(repo.resolve(), skip, limit, cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        pickle.dump(got, fh)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repos", nargs="+", type=Path)
    parser.add_argument(
        "--chunk",
        action="append",
        default=[],
        help="SKIP:LIMIT, the training commits of each repository (repeatable; 20:60)",
    )
    parser.add_argument("--store", default=str(Path(tempfile.gettempdir()) / "hybrid-fitsym"))
    parser.add_argument("--extract-only", action="store_true")
    args = parser.parse_args()
    cache = TagCache()
    cases: list[Case] = []
    for chunk in args.chunk or ["20:60"]:
        skip, limit = (int(x) for x in chunk.split(":"))
        for repo in args.repos:
            got = _load(repo, skip, limit, Path(args.store), cache)
            print(f"{repo.name} {chunk}: {len(got)} cases", flush=True)
            cases += got
    if args.extract_only or not cases:
        return
    start = current()
    _check(cases, start)
    point = ascend(cases, start)
    for name, q in (("current", start), ("fitted", point)):
        got = per_case(cases, q, ALL_BUDGETS)
        m = metrics(cases, got, ALL_BUDGETS)
        print(f"{name:8} task recall " + "/".join(f"{m[f'task{b}']:.3f}" for b in ALL_BUDGETS))
        for h, part in zip(("hash0", "hash1", "repoA", "repoB"), halves(cases), strict=True):
            mh = metrics([cases[k] for k in part], [got[k] for k in part], ALL_BUDGETS)
            print(f"   {h} " + "/".join(f"{mh[f'task{b}']:.3f}" for b in ALL_BUDGETS))
    for key in FITTED:
        if point[key] != start[key]:
            print(f"{key} = {point[key]}  (now {start[key]})")


if __name__ == "__main__":
    main()
