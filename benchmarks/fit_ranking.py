"""Fit the file ranking's fusion constants on a training set of mined fix commits.

    PYTHONPATH=. python benchmarks/fit_ranking.py REPO... [--skip 20] [--limit 130]

For each repository, the fix commits that ``hybrid context eval`` would mine are taken
after the newest ``--skip`` (those are the benchmark; keep them out of the fit). At each
commit's parent the per-file signals are computed once (BM25, full-text hits, PageRank,
mentioned paths and file names, directories, history, similar past commits, test and
auxiliary files, and each
candidate file's best symbol score); the fused score and the symbol rerank are then
recomputed for every trial point in numpy, so a search costs seconds, not a pipeline run
per point. The script checks that its recomputation reproduces ``rank`` at the current
constants.

The search is coordinate ascent on MRR + Acc@1/2 + Acc@5/4. Against overfitting the
cases are split into two halves twice (by commit hash, and by repository); a step is
kept only when it helps all four halves. Fit on training repositories only, and report
on repositories that were never used here.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from hybrid import git
from hybrid.context import ranking as R
from hybrid.context import symbols as S
from hybrid.context.cache import TagCache
from hybrid.context.evaluation import EvalCase, mine_cases
from hybrid.context.git import git_checked
from hybrid.context.graph import Graph
from hybrid.context.grep import grep_words
from hybrid.context.history import recent_changes, similar_changes
from hybrid.context.repomap import load_graph
from hybrid.context.text import IDENT_RE, STOPWORDS

RERANK_FILES = S.RERANK_FILES  # as rerank_files: the best non-test files reordered
SYMBOL_FILES = 16  # symbol scores are taken for more files, as a fitted ranking may pick them
FITTED = (
    "W_BM25",
    "W_GRAPH",
    "W_PATH",
    "STEM_WORD",
    "STEM_LEAD",
    "W_DIR",
    "W_DIR_LEAD",
    "W_HISTORY",
    "W_SIMILAR",
    "GREP_WEIGHT",
    "TEST_FACTOR",
    "AUX_FACTOR",
    "W_RERANK",
)


@dataclass
class Case:
    """The signals of one training case, one value per file."""

    repo: str
    commit: str
    gold: np.ndarray  # bool
    path_rank: np.ndarray  # position of each path in sorted order (ties break by path)
    bm25: np.ndarray
    grep: np.ndarray
    graph: np.ndarray  # normalized
    explicit: np.ndarray  # paths the task names
    stem_word: np.ndarray  # 1/k for a file name the task says (k files of that name)
    stem_lead: np.ndarray  # ... when it is the "area:" prefix
    dir_share: np.ndarray
    dir_lead: np.ndarray
    history: np.ndarray  # normalized
    similar: np.ndarray  # votes of past commits like the task (normalized)
    tests: np.ndarray
    aux: np.ndarray
    symbol: np.ndarray  # best symbol score without its file part (-1: none)
    dunder: np.ndarray  # ... that best symbol is a halved __dunder__
    score: np.ndarray  # rank()'s score at the current constants


def current() -> dict[str, float]:
    values = {k: float(getattr(R, k)) for k in FITTED if k != "W_RERANK"}
    values["W_RERANK"] = S.W_RERANK
    return values


def _norm(v: np.ndarray) -> np.ndarray:
    top = v.max() if v.size else 0.0
    return v / top if top > 0 else v


def at_parents(
    repo: Path, skip: int, limit: int, cache: TagCache
) -> Iterator[tuple[EvalCase, Graph, Path]]:
    """Each fix commit mined after the newest ``skip``, with the graph of its parent and a
    worktree checked out there (removed afterwards)."""
    cases = mine_cases(repo, limit, skip=skip)
    if not cases:
        return
    tmp = Path(tempfile.mkdtemp(prefix="hybrid-fit-"))
    worktree = tmp / "wt"
    pin = contextlib.ExitStack()  # the worktree lives in hybrid.git's shadow of the repository
    pin.enter_context(git.pinned(repo))
    git_checked(repo, "worktree", "add", "--detach", "--quiet", str(worktree), cases[0].parent)
    try:
        for case in cases:
            git_checked(worktree, "checkout", "--quiet", "--detach", "--force", case.parent)
            yield case, load_graph(worktree, cache=cache), worktree
    finally:
        git.run(["worktree", "remove", "--force", str(worktree)], repo)
        shutil.rmtree(tmp, ignore_errors=True)
        pin.close()


def extract(repo: Path, skip: int, limit: int, cache: TagCache) -> list[Case]:
    return [_signals(repo.name, *found) for found in at_parents(repo, skip, limit, cache)]


def _signals(repo: str, case: EvalCase, graph: Graph, worktree: Path) -> Case:
    paths = graph.paths
    n = len(paths)
    history = recent_changes(worktree)
    grep = partial(grep_words, worktree)
    similar = similar_changes(worktree, case.task)
    ranking = R.rank(graph, case.task, "fused", history, grep, similar)
    info = ranking.task
    saved = R.STEM_WORD, R.STEM_LEAD
    R.STEM_WORD = R.STEM_LEAD = 0.0
    explicit_paths = R.analyse_task(graph, case.task).paths
    R.STEM_WORD, R.STEM_LEAD = saved
    explicit = np.zeros(n)
    for i, w in explicit_paths.items():
        explicit[i] = w
    # the file-name matches of analyse_task, word and "area:" lead apart
    stem_word, stem_lead = np.zeros(n), np.zeros(n)
    by_stem: dict[str, list[int]] = {}
    for i, p in enumerate(paths):
        by_stem.setdefault(p.rsplit("/", 1)[-1].rsplit(".", 1)[0].lower(), []).append(i)
    for word in IDENT_RE.findall(case.task):
        w = word.lower()
        files = by_stem.get(w, [])
        if len(w) < 4 or w in STOPWORDS or not files or len(files) > 3:
            continue
        target = stem_lead if w == info.lead else stem_word
        for i in files:
            target[i] = max(target[i], 1 / len(files))
    rare = R.out_of_vocabulary(graph, case.task)
    tests = np.array(graph.tests, dtype=bool)
    files = [i for i in ranking.order if not graph.tests[i]][:SYMBOL_FILES]
    signals = S.symbol_signals(graph, ranking, worktree, files=files)
    file_part = {c[0]: signals.file[k] for k, c in enumerate(signals.cands)}
    symbol, dunder = np.full(n, -1.0), np.zeros(n, dtype=bool)
    for hit in S.score_symbols(signals):
        name = hit.definition.name
        halved = name.startswith("__") and name.endswith("__") and name not in signals.mentioned
        rest = (hit.score / S.DUNDER if halved else hit.score) - S.W_FILE * file_part[hit.file]
        if symbol[hit.file] < 0:  # best first
            symbol[hit.file], dunder[hit.file] = rest, halved
    order = np.argsort(np.array(paths, dtype=object), kind="stable")
    path_rank = np.empty(n, dtype=np.int64)
    path_rank[order] = np.arange(n)
    return Case(
        repo=repo,
        commit=case.commit,
        gold=np.isin(np.array(paths, dtype=object), case.gold),
        path_rank=path_rank,
        bm25=R.bm25(graph, info.terms),
        grep=R.text_scores(graph, grep(rare)) if rare else np.zeros(n),
        graph=_norm(ranking.graph),
        explicit=explicit,
        stem_word=stem_word,
        stem_lead=stem_lead,
        dir_share=R.directory_bonus(paths, info, 1.0, 0.0),
        dir_lead=R.directory_bonus(paths, info, 0.0, 1.0),
        history=_norm(np.log1p(np.array([history.get(p, 0.0) for p in paths]))),
        similar=_norm(np.array([similar.get(p, 0.0) for p in paths])),
        tests=tests,
        aux=np.array([p.split("/", 1)[0].lower() in R._AUX_DIRS for p in paths]),
        symbol=symbol,
        dunder=dunder,
        score=ranking.score.copy(),
    )


def fused(c: Case, p: dict[str, float]) -> np.ndarray:
    """rank()'s fused score, from the stored signals."""
    lexical = _norm(c.bm25 + p["GREP_WEIGHT"] * c.grep)
    mentioned = np.maximum(
        c.explicit, np.maximum(p["STEM_WORD"] * c.stem_word, p["STEM_LEAD"] * c.stem_lead)
    )
    s = p["W_BM25"] * lexical + p["W_GRAPH"] * c.graph + p["W_PATH"] * mentioned
    s = s + p["W_DIR"] * c.dir_share + p["W_DIR_LEAD"] * c.dir_lead
    s = s + p["W_HISTORY"] * c.history + p["W_SIMILAR"] * c.similar
    s = np.where(c.tests, s * p["TEST_FACTOR"], s)
    return np.where(c.aux, s * p["AUX_FACTOR"], s)


def first_gold(c: Case, p: dict[str, float]) -> int:
    """1-based rank of the first gold file after rerank_files (0: none)."""
    s = np.round(fused(c, p), 12)
    order = np.lexsort((c.path_rank, -s))
    top = order[~c.tests[order]][:RERANK_FILES]
    file_score = s[top] / (s[top].max() or 1.0)
    best = np.where(
        c.symbol[top] >= 0, S.W_FILE * file_score + c.symbol[top], S.W_FILE * file_score
    )
    best = np.where(c.dunder[top], S.DUNDER * best, best)
    mixed = np.round(file_score + p["W_RERANK"] * best / (best.max() or 1.0), 12)
    ranked = np.concatenate(
        [top[np.lexsort((c.path_rank[top], -mixed))], order[~np.isin(order, top)]]
    )
    hit = np.nonzero(c.gold[ranked])[0]
    return int(hit[0]) + 1 if hit.size else 0


def metrics(cases: list[Case], p: dict[str, float]) -> dict[str, float]:
    ranks = np.array([first_gold(c, p) for c in cases])
    return {
        "acc1": float(np.mean(ranks == 1)),
        "acc5": float(np.mean((ranks >= 1) & (ranks <= 5))),
        "mrr": float(np.mean(np.where(ranks > 0, 1.0 / np.maximum(ranks, 1), 0.0))),
    }


def objective(m: dict[str, float]) -> float:
    return m["mrr"] + 0.5 * m["acc1"] + 0.25 * m["acc5"]


def halves(cases: list[Case]) -> list[list[Case]]:
    repos = sorted({c.repo for c in cases})
    first = set(repos[::2])
    return [
        [c for c in cases if int(c.commit[:8], 16) % 2 == 0],
        [c for c in cases if int(c.commit[:8], 16) % 2 == 1],
        [c for c in cases if c.repo in first],
        [c for c in cases if c.repo not in first],
    ]


def _trials(key: str, v: float) -> set[float]:
    trials = {round(v * f, 4) for f in (0, 0.5, 0.7, 0.85, 1.2, 1.4, 2.0)}
    if v == 0:
        trials |= {0.1, 0.2, 0.4, 0.8}
    if key.endswith("FACTOR"):
        trials = {t for t in trials if t <= 1.0} | {1.0}
    return trials


def climb(
    start: dict[str, float],
    keys: tuple[str, ...],
    trials: Callable[[str, float], set[float]],
    score: Callable[[dict[str, float]], list[float]],
    sweeps: int,
) -> dict[str, float]:
    """Coordinate ascent from ``start``: a step is kept only when it helps every part that
    ``score`` scores (the halves of two splits), so no half pays for another's gain."""
    point = dict(start)
    now = score(point)
    for _ in range(sweeps):
        moved = False
        for key in keys:
            v = point[key]
            best: tuple[float, float, list[float]] | None = None
            for t in sorted(trials(key, v) - {v}):
                got = score({**point, key: t})
                gain = [a - b for a, b in zip(got, now, strict=True)]
                if min(gain) >= 0 and sum(gain) > 0.004 and (best is None or sum(gain) > best[0]):
                    best = (sum(gain), t, got)
            if best is not None:
                print(f"  {key}: {v} -> {best[1]} (gain {best[0]:.4f})", flush=True)
                point[key], now, moved = best[1], best[2], True
        if not moved:
            break
    return point


def ascend(cases: list[Case], start: dict[str, float], sweeps: int = 4) -> dict[str, float]:
    parts = halves(cases)
    return climb(
        start, FITTED, _trials, lambda p: [objective(metrics(h, p)) for h in parts], sweeps
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repos", nargs="+", type=Path)
    parser.add_argument("--skip", type=int, default=20, help="newest fix commits left out")
    parser.add_argument("--limit", type=int, default=130, help="training cases per repository")
    args = parser.parse_args()
    cache = TagCache()
    cases: list[Case] = []
    for repo in args.repos:
        got = extract(repo.resolve(), args.skip, args.limit, cache)
        print(f"{repo.name}: {len(got)} cases", flush=True)
        cases += got
    start = current()
    off = sum(not np.allclose(fused(c, start), c.score, atol=1e-9) for c in cases)
    print(f"{len(cases)} cases; recomputed scores differ from rank() in {off}")
    point = ascend(cases, start)
    before, after = metrics(cases, start), metrics(cases, point)
    for name, m in (("current", before), ("fitted", after)):
        print(f"{name:8} acc@1 {m['acc1']:.3f}  acc@5 {m['acc5']:.3f}  mrr {m['mrr']:.3f}")
    for key in FITTED:
        if point[key] != start[key]:
            print(f"{key} = {point[key]}  (now {start[key]})")


if __name__ == "__main__":
    main()
