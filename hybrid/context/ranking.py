"""Rank a repository's files (and symbols) for a task.

Two signals, fused:

* lexical: BM25 over each file's path words, symbol names, docstrings and references;
* structural: personalized PageRank over the file/symbol graph, seeded from what the task
  mentions (identifiers that the repo defines, paths, module names) and from the best
  lexical hits, so the mass flows to the code those files use and are used by;

plus bonuses for paths and directories the task names, for recent changes, and for the
files that past commits with messages like the task touched. The
constants were fitted on older fix commits of the training repositories
(``benchmarks/fit_ranking.py``), never on the repositories the figures are reported on.

Pure numpy on the arrays of ``Graph``; ties break by path, so the order is the same in
every process.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from hybrid.context.graph import PATH_WEIGHT, Graph, names_index
from hybrid.context.resolve import Resolver
from hybrid.context.text import IDENT_RE, STOPWORDS, stem, terms

Mode = Literal["fused", "bm25", "graph"]

K1 = 1.2
B = 0.75
DAMPING = 0.85
ITERATIONS = 30
REVERSE = 0.0  # weight of reverse edges (definition -> users); 0 measured best on histories
BM25_SEEDS = 10
W_BM25 = 0.6
W_GRAPH = 0.1  # the graph is seeded from the lexical hits too: more weight echoes BM25
W_PATH = 0.5
TEST_FACTOR = 0.5
STEM_WORD = 0.3  # a task word equal to a file's name
STEM_LEAD = 0.6  # ... when it is the "area:" prefix of the task
AUX_FACTOR = 0.5  # docs, examples, scripts: rarely where a fix goes
W_HISTORY = 0.3  # files changed in recent commits
W_SIMILAR = 0.4  # files changed by past commits whose messages resemble the task
GREP_WEIGHT = 1.0  # full-text hits of out-of-vocabulary task words, relative to BM25
W_PRIOR = 0.0  # global importance (PageRank with a uniform teleport)
W_DIR = 0.4  # share of a file's directories that task words name (crates/searcher/...)
W_DIR_LEAD = 0.7  # a directory is the "area:" prefix of the task ("searcher: fix ...")
_AUX_DIRS = frozenset(
    {"doc", "docs", "example", "examples", "scripts", "benchmarks", "bench", "tools"}
)

_CODE_BEFORE = frozenset("`.'\"")
_CODE_AFTER = frozenset("`('\"")
_PATHLIKE = re.compile(r"[\w./-]*[/.][\w./-]*\w")
_AREA = re.compile(r"\s*(?:\w+\(([\w./-]+)\)!?|([\w./-]+))\s*:")


@dataclass
class TaskTerms:
    """What a task text mentions."""

    terms: list[str]
    symbols: dict[str, float] = field(default_factory=dict)
    paths: dict[int, float] = field(default_factory=dict)
    words: frozenset[str] = frozenset()  # stems of the task's words, for directory names
    lead: str = ""  # the "area:" prefix, lower case


@dataclass
class Ranking:
    """Files and symbols by relevance, with the reasons each file got its score."""

    order: list[int]
    score: np.ndarray
    bm25: np.ndarray
    graph: np.ndarray
    symbol_score: np.ndarray
    task: TaskTerms
    reasons: dict[int, list[str]]


def analyse_task(graph: Graph, task: str, resolver: Resolver | None = None) -> TaskTerms:
    """Find the identifiers, paths and words of ``task`` that this repository knows."""
    out = TaskTerms(terms=terms(task))
    known = names_index(graph)
    lower: dict[str, list[str]] = {}
    for s in sorted(known):
        if len(s) >= 4:
            lower.setdefault(s.lower(), []).append(s)
    for match in IDENT_RE.finditer(task):
        word = match.group(0)
        before = task[match.start() - 1 : match.start()] if match.start() else " "
        after = task[match.end() : match.end() + 2] or " "
        code_like = (
            "_" in word.strip("_")
            or (any(c.isupper() for c in word[1:]) and any(c.islower() for c in word))
            or before in _CODE_BEFORE
            or after[0] in _CODE_AFTER
            or (after[0] == "." and after[1:2].isalpha())
        )
        if word in known and len(word) >= 3:
            weight = 1.0 if code_like else 0.25
            if word.lower() in STOPWORDS:
                weight *= 0.2
            out.symbols[word] = max(out.symbols.get(word, 0.0), weight)
        elif code_like and len(word) >= 4:
            for s in lower.get(word.lower(), []):
                out.symbols[s] = max(out.symbols.get(s, 0.0), 0.5)
    paths = graph.paths
    resolver = resolver or Resolver(paths)
    for match in _PATHLIKE.finditer(task):
        token = match.group(0).strip("./")
        if not token or len(token) < 3:
            continue
        hits = resolver.suffixes.get(re.sub(r"\.\w+$", "", token).replace(".", "/")) or []
        if not hits and "/" not in token:
            hits = resolver.suffixes.get(token.replace(".", "/")) or []
        for path in hits[:5]:
            i = paths.index(path)
            out.paths[i] = max(out.paths.get(i, 0.0), 1.0)
    stems: dict[str, list[int]] = {}
    for i, p in enumerate(paths):
        stems.setdefault(p.rsplit("/", 1)[-1].rsplit(".", 1)[0].lower(), []).append(i)
    # "printing: fix ...", "ignore/gitignore: ..." and "fix(binding): ..." (a conventional
    # commit's scope) name the area being changed; the last part of a path is the narrowest
    prefix = _AREA.match(task)
    lead = (prefix.group(1) or prefix.group(2)).rsplit("/", 1)[-1].lower() if prefix else ""
    out.lead = lead
    out.words = frozenset(
        stem(w.lower())
        for w in IDENT_RE.findall(task)
        if len(w) >= 4 and w.lower() not in STOPWORDS
    )
    for word in IDENT_RE.findall(task):
        w = word.lower()
        files = stems.get(w, [])
        if len(w) < 4 or w in STOPWORDS or not files or len(files) > 3:
            continue
        weight = (STEM_LEAD if w == lead else STEM_WORD) / len(files)
        for i in files:
            out.paths[i] = max(out.paths.get(i, 0.0), weight)
    return out


def bm25(graph: Graph, query: list[str]) -> np.ndarray:
    """BM25 score of every file for the query terms (paths count PATH_WEIGHT per word)."""
    n = len(graph.paths)
    scores = np.zeros(n)
    if not query or not n:
        return scores
    lengths = np.frombuffer(graph.doc_len, dtype=np.float64)
    norm = K1 * (1 - B + B * lengths / (lengths.mean() or 1.0))
    wanted = sorted(set(query))
    tf = np.zeros((len(wanted), n))
    for i, (file_tf, words) in enumerate(zip(graph.terms, graph.path_terms, strict=True)):
        for k, term in enumerate(wanted):
            c = file_tf.get(term, 0)
            if term in words:
                c += PATH_WEIGHT * words.count(term)
            if c:
                tf[k, i] = c
    for k, term in enumerate(wanted):
        row = tf[k]
        df = int(np.count_nonzero(row))
        if df:
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            scores += query.count(term) * idf * row * (K1 + 1) / (row + norm)
    return scores


def pagerank(graph: Graph, seeds: np.ndarray) -> np.ndarray:
    """Personalized PageRank over files + symbols; ``seeds`` is the teleport vector."""
    n_nodes = len(graph.paths) + len(graph.symbols)
    src = np.frombuffer(graph.src, dtype=np.int32)
    dst = np.frombuffer(graph.dst, dtype=np.int32)
    w = np.frombuffer(graph.weight, dtype=np.float64)
    if REVERSE:
        src, dst, w = (
            np.concatenate([src, dst]),
            np.concatenate([dst, src]),
            np.concatenate([w, w * REVERSE]),
        )
    out_sum = np.bincount(src, weights=w, minlength=n_nodes)
    wn = w / np.where(out_sum[src] > 0, out_sum[src], 1.0)
    dangling = out_sum == 0
    total = seeds.sum()
    p = seeds / total if total > 0 else np.full(n_nodes, 1.0 / n_nodes)
    x = p.copy()
    for _ in range(ITERATIONS):
        y = np.bincount(dst, weights=wn * x[src], minlength=n_nodes)
        y = DAMPING * (y + x[dangling].sum() * p) + (1 - DAMPING) * p
        if np.abs(y - x).sum() < 1e-9:
            x = y
            break
        x = y
    return x


def directory_bonus(
    paths: list[str], info: TaskTerms, share: float = W_DIR, area: float = W_DIR_LEAD
) -> np.ndarray:
    """Per file: ``share`` times the share of its directories that the task's words name,
    plus ``area`` when one of them is the task's "area:" prefix (by stem, so "parser:" finds
    parsers/). One pass over the distinct directories."""
    lead = stem(info.lead) if len(info.lead) >= 3 else ""
    memo: dict[str, float] = {}
    out = np.zeros(len(paths))
    for i, p in enumerate(paths):
        folder = p.rpartition("/")[0]
        if not folder:
            continue
        got = memo.get(folder)
        if got is None:
            parts = [stem(x.lower()) for x in folder.split("/")]
            got = share * sum(x in info.words for x in parts) / len(parts)
            if lead and lead in parts:
                got += area
            memo[folder] = got
        out[i] = got
    return out


def _normalized(v: np.ndarray) -> np.ndarray:
    top = v.max() if v.size else 0.0
    return v / top if top > 0 else v


def out_of_vocabulary(graph: Graph, task: str) -> list[str]:
    """Task words (typos, error-message words, locals) that no name, docstring or path holds."""
    candidates = []
    for word in sorted({w.lower() for w in IDENT_RE.findall(task)}):
        if len(word) < 5 or word in STOPWORDS or word.isdigit():
            continue
        keys = {word, stem(word), *terms(word)}
        candidates.append((word, keys))
    if not candidates:
        return []
    found: set[str] = set()
    for file_tf, words in zip(graph.terms, graph.path_terms, strict=True):
        for word, keys in candidates:
            if word not in found and any(k in file_tf or k in words for k in keys):
                found.add(word)
    return [w for w, _ in candidates if w not in found]


def text_scores(graph: Graph, hits: dict[str, dict[str, int]]) -> np.ndarray:
    """BM25-style scores from full-text hits of rare words (``grep_words`` output)."""
    paths = graph.paths
    n = len(paths)
    scores = np.zeros(n)
    index = {p: i for i, p in enumerate(paths)}
    lengths = np.frombuffer(graph.doc_len, dtype=np.float64)
    norm = K1 * (1 - B + B * lengths / (lengths.mean() or 1.0))
    for word in sorted(hits):
        files = {index[p]: c for p, c in hits[word].items() if p in index}
        df = len(files)
        if not df or df > max(3, n // 20):
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, c in sorted(files.items()):
            scores[i] += idf * c * (K1 + 1) / (c + norm[i])
    return scores


def rank(
    graph: Graph,
    task: str = "",
    mode: Mode = "fused",
    history: dict[str, float] | None = None,
    grep: Callable[[list[str]], dict[str, dict[str, int]]] | None = None,
    similar: dict[str, float] | None = None,
) -> Ranking:
    """Rank files for ``task``; ``mode`` selects the fused score or one signal alone.

    ``history`` (path -> recency-weighted change count, see ``recent_changes``) adds a
    prior for files the project has been changing lately; only the fused mode uses it.
    ``grep`` (e.g. ``partial(grep_words, root)``) finds task words that the index does not
    hold in the files' full text; they count as lexical evidence. ``similar`` (path ->
    votes of past commits whose messages resemble the task, see ``similar_changes``) adds
    the files those commits touched; only the fused mode uses it.
    """
    paths = graph.paths
    n = len(paths)
    n_sym = len(graph.symbols)
    info = analyse_task(graph, task) if task else TaskTerms(terms=[])
    lexical = bm25(graph, info.terms) if mode != "graph" else np.zeros(n)
    if task and grep is not None and mode != "graph":
        rare = out_of_vocabulary(graph, task)
        if rare:
            lexical = lexical + GREP_WEIGHT * text_scores(graph, grep(rare))
    seeds = np.zeros(n + n_sym)
    by_name = names_index(graph)
    structural_seeds = bool(info.symbols or info.paths)
    for name, weight in info.symbols.items():
        # a name's definitions share its seed (Session.send and Adapter.send: half each)
        ids = by_name[name]
        n_files = len({i for j in ids for i in graph.definers[j]})
        for j in ids:
            seeds[n + j] += weight / math.sqrt(n_files) / len(ids)
    for i, weight in info.paths.items():
        seeds[i] += weight
    if structural_seeds:
        seeds /= seeds.sum()
    if mode == "fused" and lexical.any():
        best = np.argsort(-lexical, kind="stable")[:BM25_SEEDS]
        lex_seeds = np.zeros(n + n_sym)
        lex_seeds[best] = lexical[best]
        lex_seeds /= lex_seeds.sum()
        seeds = 0.5 * seeds + lex_seeds if structural_seeds else lex_seeds
    tests = np.array(graph.tests, dtype=bool) if n else np.zeros(0, dtype=bool)
    if not seeds.any():
        seeds[:n] = np.where(tests, 0.2, 1.0)  # no task: global importance, tests last
    structural = np.zeros(n + n_sym) if mode == "bm25" else pagerank(graph, seeds)
    file_graph = structural[:n]
    path_bonus = np.zeros(n)
    for i, weight in info.paths.items():
        path_bonus[i] = weight
    if mode == "bm25":
        score = _normalized(lexical)
    elif mode == "graph":
        score = _normalized(file_graph)
    else:
        score = W_BM25 * _normalized(lexical) + W_GRAPH * _normalized(file_graph)
    score = score + W_PATH * path_bonus * (mode != "bm25")
    folders = np.zeros(n)
    if task and mode == "fused" and (W_DIR or W_DIR_LEAD):
        folders = directory_bonus(paths, info)
        score = score + folders
    if task and mode != "bm25" and W_PRIOR:
        prior = pagerank(graph, np.concatenate([np.where(tests, 0.2, 1.0), np.zeros(n_sym)]))
        score = score + W_PRIOR * _normalized(prior[:n])
    if task and mode == "fused" and history and W_HISTORY:
        recent = np.array([history.get(p, 0.0) for p in paths])
        score = score + W_HISTORY * _normalized(np.log1p(recent))
    if task and mode == "fused" and similar and W_SIMILAR:
        votes = np.array([similar.get(p, 0.0) for p in paths])
        score = score + W_SIMILAR * _normalized(votes)
    if task:
        score = np.where(tests, score * TEST_FACTOR, score)
        aux = np.array([p.split("/", 1)[0].lower() in _AUX_DIRS for p in paths], dtype=bool)
        score = np.where(aux, score * AUX_FACTOR, score)
    # Stable by path: argsort on (-score, path index) gives the same order everywhere.
    order = sorted(range(n), key=lambda i: (-round(float(score[i]), 12), paths[i]))
    reasons = _reasons(graph, info, lexical, file_graph, folders, order[:50])
    return Ranking(order, score, lexical, file_graph, structural[n:], info, reasons)


def _has_term(graph: Graph, term: str, i: int) -> bool:
    return term in graph.terms[i] or term in graph.path_terms[i]


def _reasons(
    graph: Graph,
    info: TaskTerms,
    lexical: np.ndarray,
    structural: np.ndarray,
    folders: np.ndarray,
    top: list[int],
) -> dict[int, list[str]]:
    by_name = names_index(graph)
    defined_here: dict[int, list[str]] = {}
    for name in sorted(info.symbols):
        for j in by_name[name]:
            for i in graph.definers[j]:
                if name not in defined_here.get(i, []):
                    defined_here.setdefault(i, []).append(name)
    query = sorted(set(info.terms))
    out: dict[int, list[str]] = {}
    for i in top:
        why: list[str] = []
        if i in info.paths:
            why.append("path mentioned in the task")
        if folders[i] > 0:
            why.append("directory named in the task")
        if i in defined_here:
            why.append("defines " + ", ".join(defined_here[i][:5]))
        if lexical[i] > 0:
            matched = [t for t in query if _has_term(graph, t, i)][:6]
            why.append(f"bm25 {lexical[i]:.2f} ({', '.join(matched)})")
        if structural[i] > 0:
            why.append(f"pagerank {structural[i]:.4f}")
        out[i] = why
    return out


def stem_terms(words: list[str]) -> list[str]:
    """Stemmed, stop-word-free terms (exposed for callers building their own queries)."""
    return [stem(w.lower()) for w in words if w.lower() not in STOPWORDS]
