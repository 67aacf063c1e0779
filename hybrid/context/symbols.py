"""Rank the symbols (functions, methods, classes) of the best files for a task.

A file ranking finds where to look; a fix changes a few bodies inside those files. Every
definition of the top files (a file with none is one candidate, packed whole) is scored by:

* ``name``: the task names it (``request``, ``Session.request``) or shares words with its name;
* ``text``: BM25 of the task's words over its body and docstring;
* ``graph``: its callers and callees among the candidates score well (one step of spreading);
* ``tests``: test functions whose names share the task's words call it;
* ``history``: recent commits changed its lines;
* ``similar``: past commits whose messages are like the task added lines it still holds;

on top of its file's score. Each signal can be left out (``ablate``) for the evaluation.
Ties break by path and line, so the order is the same in every process.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from hybrid.context.git import git_text
from hybrid.context.graph import Graph
from hybrid.context.history import similar_commits
from hybrid.context.index import RepoIndex
from hybrid.context.ranking import Ranking
from hybrid.context.resolve import test_spans
from hybrid.context.tags import FILE_KIND, Definition
from hybrid.context.text import IDENT_RE, ident_terms, name_terms
from hybrid.errors import ContextError
from hybrid.repofs import Refused, read_text

SIGNALS = ("name", "text", "graph", "tests", "history", "similar")
# Symbols of this many of the best files compete for the bodies: a fix's file is often
# ranked a little lower than the files the task's words match best.
CANDIDATE_FILES = 12
RERANK_FILES = 8  # ... of which this many are reordered by their symbols (as fitted)
TEST_FILES = 6
HISTORY_COMMITS = 30
W_FILE = 1.0
W_NAME = 0.96
W_TEXT = 1.0
W_GRAPH = 0.3
W_TESTS = 0.0  # test names calling a symbol did not help find the edit (fit_symbols)
W_HISTORY = 0.2
W_SIMILAR = 0.8  # lines that past commits like the task added (history.similar_commits)
W_RERANK = 0.6  # weight of a file's best symbol when the top files are reordered
K1 = 1.44
B = 0.75
DUNDER = 1.0  # weight of a __dunder__ the task does not name (halving them hurt)
_BODY_KINDS = frozenset({"function", "method", "class", "constant", "macro", "type", "interface"})
_CONTAINER_KINDS = frozenset({"class", "interface", "module", "type"})
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.M)


@dataclass(frozen=True)
class SymbolHit:
    """One ranked definition of one file."""

    file: int
    path: str
    definition: Definition
    score: float
    reasons: tuple[str, ...] = field(default_factory=tuple)
    start: int = 0  # first line of the body with its doc comment and decorators (0: line)

    @property
    def span(self) -> tuple[int, int]:
        """Lines of the definition with the comments and decorators right above it."""
        return (self.start or self.definition.line, self.definition.end_line)


def whole_file(path: str, n_lines: int) -> Definition:
    """A file with no definitions to rank (a script, an example app, a module of constants)
    as one candidate of its own, named after the file: its code is all at the top level."""
    stem = path.rsplit("/", 1)[-1].split(".", 1)[0]
    return Definition(stem, FILE_KIND, 1, max(1, n_lines), path)


_LEAD = ("//", "/*", "*", "#", "@", "--")
_NOT_LEAD = ("#include", "#define", "#if", "#endif", "#else", "#pragma", "#import", "#!")


def leading_start(lines: list[str], line: int) -> int:
    """First line of the comment block and decorators directly above 1-based ``line``."""
    start = line
    while start > 1:
        above = lines[start - 2].strip()
        if not above or not above.startswith(_LEAD) or above.startswith(_NOT_LEAD):
            break
        start -= 1
    return start


def _lines(root: Path, path: str) -> list[str] | None:
    try:
        return read_text(root, path).splitlines()
    except Refused:
        return None


def _recent_lines(root: Path, paths: list[str]) -> dict[str, Counter[int]]:
    """Lines (of today's files, approximately) changed by the last commits, per path."""
    if not paths:
        return {}
    args = ["log", f"-n{HISTORY_COMMITS}", "--no-merges", "-U0", "--format=%x00", "--relative"]
    out = git_text(root, *args, "--", *paths, timeout=30)
    if out is None:
        return {}
    touched: dict[str, Counter[int]] = {}
    current = ""
    for line in out.splitlines():
        if line.startswith("+++ "):
            current = line[6:] if line.startswith("+++ b/") else ""
        elif current and line.startswith("@@"):
            match = _HUNK.match(line)
            if match:
                start = int(match.group(1))
                count = 1 if match.group(2) is None else int(match.group(2))
                counter = touched.setdefault(current, Counter())
                for n in range(start, start + max(count, 1)):
                    counter[n] += 1
    return touched


_MIN_LINE = 8  # a shorter added line ("}", "pass") says nothing about where it went


def _similar_lines(
    root: Path, query: set[str], lines_of: dict[str, list[str]]
) -> dict[str, dict[int, float]]:
    """Lines of today's files (``lines_of``) that past commits like the task added, found by
    their text (so later edits above them do not shift them), weighted by how like the task
    each commit is (the best 1)."""
    found = similar_commits(root, query)
    shas = [sha for sha, _s, files in found if any(f in lines_of for f in files)]
    if not shas:
        return {}
    weight = {sha: score / found[0][1] for sha, score, _f in found}
    args = ["show", "-U0", "--no-color", "--no-renames", "--format=%x00%H", "--relative"]
    out = git_text(root, *args, *shas, "--", *sorted(lines_of), timeout=30)
    if out is None:
        return {}
    where: dict[str, dict[str, list[int]]] = {}
    touched: dict[str, dict[int, float]] = {}
    w = 0.0
    current = ""
    for line in out.split("\n"):
        if line.startswith("\x00"):
            w, current = weight.get(line[1:].strip(), 0.0), ""
        elif line.startswith("+++ "):
            current = line[6:] if line.startswith("+++ b/") and line[6:] in lines_of else ""
            if current and current not in where:
                at: dict[str, list[int]] = {}
                for n, text in enumerate(lines_of[current], 1):
                    if len(text.strip()) >= _MIN_LINE:
                        at.setdefault(text.strip(), []).append(n)
                where[current] = at
        elif current and line.startswith("+"):
            hits = where[current].get(line[1:].strip(), [])
            if 0 < len(hits) <= 3:
                votes = touched.setdefault(current, {})
                for n in hits:
                    votes[n] = votes.get(n, 0.0) + w / len(hits)
    return touched


def _test_calls(
    graph: Graph, ranking: Ranking, index: RepoIndex, root: Path, query: set[str]
) -> Counter[str]:
    """Names called by the best test files' test functions whose names share task words,
    weighted by how many words they share."""
    paths = graph.paths
    called: Counter[str] = Counter()
    tests = [i for i in ranking.order if graph.tests[i]][:TEST_FILES]
    for i in tests:
        try:
            tags = index.tags(paths[i])
        except ContextError:
            continue
        lines = None
        for d in tags.definitions:
            if d.kind == "local" or d.kind in _CONTAINER_KINDS:
                continue
            shared = len(query.intersection(name_terms(d.name)))
            if not shared:
                continue
            if lines is None:
                lines = _lines(root, paths[i]) or []
            for name in set(IDENT_RE.findall("\n".join(lines[d.line : d.end_line]))):
                called[name] += shared
    return called


@dataclass(frozen=True)
class Weights:
    """How much each signal adds to a symbol's score (the evaluation tunes these)."""

    file: float = W_FILE
    name: float = W_NAME
    text: float = W_TEXT
    graph: float = W_GRAPH
    tests: float = W_TESTS
    history: float = W_HISTORY
    similar: float = W_SIMILAR


@dataclass
class Signals:
    """The raw per-candidate signals of one task (costly to compute, cheap to weigh)."""

    paths: list[str]
    cands: list[tuple[int, Definition, int]]  # (file, definition, first line with its doc)
    file: list[float]  # file score, normalized
    name: list[float]
    text: list[float]
    calls: list[list[int]]  # candidates each one calls (resolved by scope)
    tests: list[float]
    history: list[float]
    mentioned: dict[str, float]
    similar: list[float] = field(default_factory=list)
    # what the text signal is made of, so a fit can weigh it again (benchmarks/fit_symbols)
    lengths: list[int] = field(default_factory=list)  # terms in each body
    terms: list[Counter[str]] = field(default_factory=list)  # task terms in each body


def symbol_signals(
    graph: Graph,
    ranking: Ranking,
    root: str | Path,
    *,
    files: Iterable[int] | None = None,
    ablate: frozenset[str] = frozenset(),
) -> Signals:
    """Every signal of every definition of the best non-test files (or of ``files``)."""
    root_path = Path(root)
    index = graph.repo_index
    paths: list[str] = graph.paths
    if files is None:
        files = [i for i in ranking.order if not graph.tests[i]][:CANDIDATE_FILES]
    file_ids = list(dict.fromkeys(files))
    index.payloads([paths[i] for i in file_ids])
    top_score = max((float(ranking.score[i]) for i in file_ids), default=0.0) or 1.0
    query = set(ranking.task.terms)
    mentioned = ranking.task.symbols
    task_words = set(ranking.task.terms)

    # candidates, with per-body term statistics from one pass over each file's lines
    defs_of: list[tuple[int, list[Definition], list[str]]] = []
    lines_of: dict[str, list[str]] = {}
    for i in file_ids:
        try:
            tags = index.tags(paths[i])
        except ContextError:
            continue
        lines = _lines(root_path, paths[i])
        if lines is not None:
            tests = test_spans(tags.definitions)
            defs = [
                d
                for d in tags.definitions
                if d.kind in _BODY_KINDS
                and not any(a <= d.line and d.end_line <= b for a, b in tests)
            ]
            if not defs and any(line.strip() for line in lines):
                defs = [whole_file(paths[i], len(lines))]
            defs_of.append((i, defs, lines))
            lines_of[paths[i]] = lines
    names = {d.name for _, defs, _ in defs_of for d in defs if d.kind != FILE_KIND}
    raw: list[tuple[int, Definition, int, Counter[str], set[str], int]] = []
    for i, defs, lines in defs_of:
        length = [0] * (len(lines) + 1)  # prefix sums of term counts
        hits_at: dict[int, list[str]] = {}  # line -> query terms on it
        names_at: dict[int, set[str]] = {}  # line -> candidate names used on it
        for n_line, line in enumerate(lines, 1):
            count = 0
            for ident in IDENT_RE.findall(line):
                got = ident_terms(ident)
                count += len(got)
                for t in got:
                    if t in query:
                        hits_at.setdefault(n_line, []).append(t)
                if ident in names:
                    names_at.setdefault(n_line, set()).add(ident)
            length[n_line] = length[n_line - 1] + count
        for d in defs:
            last = min(d.end_line, len(lines))
            tf: Counter[str] = Counter()
            used: set[str] = set()
            first = leading_start(lines, d.line)
            for n_line in range(first, last + 1):
                if n_line in hits_at:
                    tf.update(hits_at[n_line])
                if n_line in names_at and d.kind not in _CONTAINER_KINDS:
                    used |= names_at[n_line]
            raw.append((i, d, length[last] - length[max(first - 1, 0)], tf, used, first))
    n = len(raw)
    out = Signals(
        paths=paths,
        cands=[(c[0], c[1], c[5]) for c in raw],
        file=[float(ranking.score[c[0]]) / top_score for c in raw],
        name=[0.0] * n,
        text=[0.0] * n,
        calls=[[] for _ in range(n)],
        tests=[0.0] * n,
        history=[0.0] * n,
        mentioned=dict(mentioned),
        lengths=[c[2] for c in raw],
        terms=[c[3] for c in raw],
        similar=[0.0] * n,
    )
    if not raw:
        return out
    # BM25 over bodies, with statistics of this candidate set
    avg = sum(c[2] for c in raw) / n or 1.0
    df: Counter[str] = Counter()
    for c in raw:
        df.update(c[3].keys())
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in query}
    for k, (_i, d, body_len, tf, _used, _first) in enumerate(raw):
        if "text" not in ablate and query:
            norm = K1 * (1 - B + B * body_len / avg)
            out.text[k] = sum(idf[t] * c * (K1 + 1) / (c + norm) for t, c in tf.items())
        if "name" not in ablate:
            score = mentioned.get(d.name, 0.0) * 2.0
            if score and d.scope and d.scope.rsplit(".", 1)[-1] in mentioned:
                score += 1.0  # Session.request named as such
            score += sum(idf.get(t, 0.0) for t in sorted(set(name_terms(d.name)) & task_words)) / 2
            out.name[k] = score
    if "graph" not in ablate:
        by_name: dict[str, list[int]] = {}
        for k, c in enumerate(raw):
            if c[1].kind != FILE_KIND:  # a file is not called by its name
                by_name.setdefault(c[1].name, []).append(k)
        for k, c in enumerate(raw):
            called: set[int] = set()
            for ident in sorted(c[4]):
                # resolve a name to the same class's definition, else the same file's,
                # else every candidate of that name
                targets = by_name.get(ident, [])
                same_file = [j for j in targets if raw[j][0] == c[0]]
                same_scope = [j for j in same_file if raw[j][1].scope == c[1].scope]
                called.update(j for j in same_scope or same_file or targets if j != k)
            out.calls[k] = sorted(called)
    if "tests" not in ablate and query:
        called_by_tests = _test_calls(graph, ranking, index, root_path, query)
        top_called = max(called_by_tests.values(), default=0) or 1
        out.tests = [called_by_tests.get(c[1].name, 0) / top_called for c in raw]
    if "history" not in ablate:
        touched = _recent_lines(root_path, sorted({paths[c[0]] for c in raw}))
        hist = []
        for i, d, _len, _tf, _used, first in raw:
            counter = touched.get(paths[i])
            changed = sum(counter[x] for x in range(first, d.end_line + 1)) if counter else 0
            hist.append(math.log1p(changed))
        top_hist = max(hist, default=0.0) or 1.0
        out.history = [h / top_hist for h in hist]
    if "similar" not in ablate and query:
        added = _similar_lines(root_path, query, lines_of)
        sim = []
        for i, d, _len, _tf, _used, first in raw:
            at = added.get(paths[i])
            votes = sum(at.get(x, 0.0) for x in range(first, d.end_line + 1)) if at else 0.0
            sim.append(math.log1p(votes))
        top_sim = max(sim, default=0.0) or 1.0
        out.similar = [v / top_sim for v in sim]
    return out


def score_symbols(signals: Signals, weights: Weights = Weights()) -> list[SymbolHit]:
    """Weigh ``signals`` into ranked hits, best first."""
    cands = signals.cands
    n = len(cands)
    if not n:
        return []
    top_text = max(signals.text) or 1.0
    top_name = max(signals.name) or 1.0
    base = [
        weights.file * signals.file[k]
        + weights.text * signals.text[k] / top_text
        + weights.name * signals.name[k] / top_name
        for k in range(n)
    ]
    caller = [0.0] * n
    callee = [0.0] * n
    for k, targets in enumerate(signals.calls):
        for j in targets:
            caller[j] = max(caller[j], base[k])  # k calls j
            callee[k] = max(callee[k], base[j])
    mentioned = signals.mentioned
    hits: list[SymbolHit] = []
    for k, (i, d, start) in enumerate(cands):
        graph_bonus = weights.graph * (caller[k] + callee[k]) / 2
        test_bonus = weights.tests * signals.tests[k]
        history_bonus = weights.history * signals.history[k]
        similar_bonus = weights.similar * signals.similar[k] if signals.similar else 0.0
        score = base[k] + graph_bonus + test_bonus + history_bonus + similar_bonus
        if d.name.startswith("__") and d.name.endswith("__") and d.name not in mentioned:
            score *= DUNDER
        why = []
        if signals.name[k]:
            why.append("named in the task" if d.name in mentioned else "name shares task words")
        if signals.text[k]:
            why.append(f"body bm25 {signals.text[k]:.2f}")
        if graph_bonus > 0.05:
            why.append("calls or is called by a match")
        if test_bonus:
            why.append("called by a matching test")
        if history_bonus:
            why.append("changed recently")
        if similar_bonus:
            why.append("changed by past commits like the task")
        hits.append(SymbolHit(i, signals.paths[i], d, round(score, 9), tuple(why), start))
    hits.sort(key=lambda h: (-h.score, h.path, h.definition.line, h.definition.name))
    return hits


def rank_symbols(
    graph: Graph,
    ranking: Ranking,
    root: str | Path,
    *,
    files: Iterable[int] | None = None,
    ablate: frozenset[str] = frozenset(),
) -> list[SymbolHit]:
    """Definitions of the best non-test files (or of ``files``), best first."""
    if not W_TESTS:
        ablate |= {"tests"}  # no weight: not worth reading the test files
    if not W_SIMILAR:
        ablate |= {"similar"}  # ... nor the past commits' diffs
    return score_symbols(symbol_signals(graph, ranking, root, files=files, ablate=ablate))


def rerank_files(graph: Graph, ranking: Ranking, hits: list[SymbolHit]) -> Ranking:
    """``ranking`` with the files of ``hits`` first, ordered by their file score plus their
    best symbol's: a file whose body matches the task well moves up among the top files."""
    if not hits:
        return ranking
    paths: list[str] = graph.paths
    best: dict[int, float] = {}
    for h in hits:
        best.setdefault(h.file, h.score)  # hits are best first
    top = [i for i in ranking.order if i in best][:RERANK_FILES]
    top_file = max(float(ranking.score[i]) for i in top) or 1.0
    top_hit = max(best.values()) or 1.0

    def key(i: int) -> tuple[float, str]:
        mixed = float(ranking.score[i]) / top_file + W_RERANK * best[i] / top_hit
        return (-round(mixed, 12), paths[i])

    first = sorted(top, key=key)
    chosen = set(first)
    return replace(ranking, order=first + [i for i in ranking.order if i not in chosen])
