"""``hybrid context eval``: the repository's own bug-fix history as a localization benchmark.

Bug-fix commits are mined from ``git log`` (message as the task, the non-test source files
it modified as the gold files), newest first, so the selection is deterministic.
Housekeeping commits (typos, docs, comments, lint and type-checker findings) are left out:
their messages name no behaviour a task could describe. Each
parent is checked out in one temporary worktree; the index there reuses the tag cache
(blob ids), so only files that differ between parents are parsed.

Two questions are scored: did the ranking find the file (Acc@1, Acc@5, MRR), and did the
pack hold the code that had to change (edit-site recall). A hunk of the fix is covered when
the pack holds verbatim a line the fix changed (in a whole file, a symbol's full text or a
file's frame; never in a skeleton, whose signatures may be rewrapped), or, for a pure
insertion, the line it follows; a task is covered when all its hunks are. Hunks inside a
source file's own test module (Rust's ``mod tests``) are test code written with the fix,
and are not scored.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pydantic import BaseModel, Field

from hybrid import git
from hybrid.context.cache import TagCache
from hybrid.context.git import git_checked
from hybrid.context.graph import Graph
from hybrid.context.grep import grep_words
from hybrid.context.history import recent_changes, similar_changes
from hybrid.context.languages import EXTENSIONS
from hybrid.context.pack import ContextPack
from hybrid.context.resolve import is_test_path, test_spans
from hybrid.errors import ContextError, InvalidInput

MODES = ("fused", "bm25", "graph")
BUDGETS = (2000, 4000, 8000, 16000)
# Pack variants scored for edit-site recall: name -> (file ranking mode, symbol ranking on?,
# symbol signals left out). The full pack, then one thing left out at a time.
VARIANTS: dict[str, tuple[str, bool, frozenset[str]]] = {
    "full": ("fused", True, frozenset()),
    "no-symbol-ranking": ("fused", False, frozenset()),
    "no-name": ("fused", True, frozenset({"name"})),
    "no-text": ("fused", True, frozenset({"text"})),
    "no-graph": ("fused", True, frozenset({"graph"})),
    "no-tests": ("fused", True, frozenset({"tests"})),
    "no-history": ("fused", True, frozenset({"history"})),
    "no-similar": ("fused", True, frozenset({"similar"})),
    "files-bm25": ("bm25", True, frozenset()),
    "files-graph": ("graph", True, frozenset()),
}
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", re.M)
_FIX = re.compile(
    r"\b(fix(e[sd]|ing)?|bug|regression|crash(es|ed)?|broken|incorrect|wrong|error|fail(s|ed|ure)?)\b",
    re.I,
)
# Housekeeping, not a bug a task could describe: the message names no behaviour to find
# ("fix typo", "fix mypy findings", "Fix linter errors", "doc: fix ...").
_CHORE = re.compile(
    r"\b(typos?|spelling|grammar|lint(er|ers|ing)?|mypy|flake8|ruff|pylint|clippy|pre-commit|"
    r"docs?|documentation|docstrings?|comments?|changelog|readme|warnings)\b",
    re.I,
)
_TRAILER = re.compile(r"^(signed-off-by|co-authored-by|reviewed-by|acked-by|cc):", re.I)
_MAX_GOLD = 3


class EvalCase(BaseModel):
    """One bug-fix commit: the task text and the files it changed."""

    commit: str
    parent: str
    task: str
    gold: list[str]


class Metrics(BaseModel):
    """File-level localization quality of one ranking mode."""

    acc_at_1: float
    acc_at_5: float
    mrr: float


class EditMetrics(BaseModel):
    """Edit-site recall of one pack variant at one budget."""

    task_recall: float = Field(description="share of tasks with every hunk covered")
    hunk_recall: float = Field(description="share of all hunks covered")


class Hunk(BaseModel):
    """One hunk of a fix, as lines of the parent: the changed lines, or for a pure
    insertion the one line it follows."""

    path: str
    lines: tuple[int, int]


class CaseResult(BaseModel):
    """Where each mode put the first gold file (1-based; 0 = not found), and which hunks
    each pack variant covered at each budget."""

    commit: str
    subject: str
    gold: list[str]
    rank: dict[str, int]
    top: list[str] = Field(description="the fused mode's top five files")
    hunks: int = 0
    covered: dict[str, dict[int, int]] = Field(
        default_factory=dict, description="variant -> budget -> hunks covered"
    )


class EvalReport(BaseModel):
    """The eval table: metrics per mode over the mined cases."""

    repo: str
    cases: int
    metrics: dict[str, Metrics]
    edit: dict[str, dict[int, EditMetrics]] = Field(
        default_factory=dict, description="edit-site recall: variant -> budget -> metrics"
    )
    results: list[CaseResult]


def _task_text(message: str) -> str:
    lines = [ln for ln in message.strip().splitlines() if not _TRAILER.match(ln.strip())]
    return "\n".join(lines).strip()


def mine_cases(
    repo: str | Path, limit: int = 50, rev: str = "HEAD", skip: int = 0
) -> list[EvalCase]:
    """Bug-fix commits of ``repo`` (newest first) that modify 1-3 non-test source files;
    the newest ``skip`` of them are passed over (older cases make a training set apart
    from the newest, which are the benchmark)."""
    repo_path = Path(repo)
    if git_checked(repo_path, "rev-parse", "--is-inside-work-tree").strip() != "true":
        raise InvalidInput(f"{repo} is not a git work tree")
    # Streamed: a long history (sympy: 50k commits) is read only as far as needed.
    cmd = [
        "log",
        "--no-merges",
        "--no-renames",
        "--format=%x1e%H%x1f%P%x1f%B%x1f",
        "--name-status",
        rev,
    ]
    cases: list[EvalCase] = []
    with git.popen(cmd, repo_path, stdout=subprocess.PIPE, text=True, errors="replace") as proc:
        assert proc.stdout is not None
        buffer: list[str] = []
        for line in proc.stdout:
            if line.startswith("\x1e") and buffer:
                case = _case("".join(buffer))
                if case is not None:
                    if skip:
                        skip -= 1
                    else:
                        cases.append(case)
                        if len(cases) >= limit:
                            break
                buffer = []
            buffer.append(line)
        else:
            case = _case("".join(buffer)) if buffer else None
            if case is not None and not skip and len(cases) < limit:
                cases.append(case)
        proc.kill()
    return cases


def _case(record: str) -> EvalCase | None:
    fields = record.lstrip("\x1e").split("\x1f")
    if len(fields) < 4:
        return None
    commit, parents, message, changes = fields[0], fields[1].split(), fields[2], fields[3]
    subject = message.strip().split("\n", 1)[0]
    if len(parents) != 1 or not _FIX.search(message) or _CHORE.search(subject):
        return None
    gold: list[str] = []
    source_changed = 0
    for line in changes.strip().splitlines():
        status, _, path = line.partition("\t")
        if Path(path).suffix not in EXTENSIONS or is_test_path(path):
            continue
        source_changed += 1
        if status == "M":
            gold.append(path)
    if not gold or source_changed > _MAX_GOLD:
        return None
    return EvalCase(commit=commit, parent=parents[0], task=_task_text(message), gold=sorted(gold))


def fix_hunks(repo: Path, case: EvalCase) -> list[Hunk]:
    """The hunks of ``case``'s fix in its gold files, as line ranges of the parent."""
    diff = git_checked(
        repo, "diff", "-U0", "--no-renames", case.parent, case.commit, "--", *case.gold
    )
    hunks: list[Hunk] = []
    path = ""
    for line in diff.splitlines():
        if line.startswith("--- "):
            path = line[6:] if line.startswith("--- a/") else ""
            continue
        match = _HUNK.match(line)
        if match and path:
            start = int(match.group(1))
            count = 1 if match.group(2) is None else int(match.group(2))
            if count == 0:  # pure insertion after line `start` (0: at the top)
                hunks.append(Hunk(path=path, lines=(max(1, start), max(1, start))))
            else:
                hunks.append(Hunk(path=path, lines=(start, start + count - 1)))
    return hunks


def source_hunks(graph: Graph, hunks: list[Hunk]) -> list[Hunk]:
    """``hunks`` less those inside a source file's own test module: a test written with
    the fix is not code the pack had to show."""
    known = set(graph.paths)
    spans = {
        path: test_spans(graph.repo_index.tags(path).definitions)
        for path in {h.path for h in hunks}
        if path in known
    }
    return [
        h
        for h in hunks
        if not any(a <= h.lines[0] and h.lines[1] <= b for a, b in spans.get(h.path, []))
    ]


def covered_hunks(pack: ContextPack, hunks: list[Hunk]) -> int:
    """How many ``hunks`` have a line among the lines the pack holds verbatim."""
    held: dict[str, list[tuple[int, int]]] = {}
    for item in pack.items:
        if item.path and item.spans:
            held.setdefault(item.path, []).extend(item.spans)
    n = 0
    for hunk in hunks:
        lo, hi = hunk.lines
        if any(a <= hi and lo <= b for a, b in held.get(hunk.path, [])):
            n += 1
    return n


def _edit_metrics(results: list[CaseResult], variant: str, budget: int) -> EditMetrics:
    scored = [r for r in results if r.hunks]
    if not scored:
        return EditMetrics(task_recall=0.0, hunk_recall=0.0)
    total = sum(r.hunks for r in scored)
    return EditMetrics(
        task_recall=sum(1 for r in scored if r.covered[variant][budget] == r.hunks) / len(scored),
        hunk_recall=sum(r.covered[variant][budget] for r in scored) / total,
    )


def _first_gold(graph: Graph, order: list[int], gold: list[str]) -> int:
    """1-based position of the first gold file in ``order`` (0: not ranked)."""
    paths = graph.paths
    found = [k + 1 for k, i in enumerate(order) if paths[i] in gold]
    return found[0] if found else 0


def _metrics(ranks: list[int]) -> Metrics:
    n = len(ranks) or 1
    return Metrics(
        acc_at_1=sum(1 for r in ranks if r == 1) / n,
        acc_at_5=sum(1 for r in ranks if 1 <= r <= 5) / n,
        mrr=sum(1.0 / r for r in ranks if r > 0) / n,
    )


def evaluate(
    repo: str | Path,
    limit: int = 50,
    *,
    cache: TagCache | None = None,
    progress: Callable[[int, int], None] | None = None,
    budgets: tuple[int, ...] = BUDGETS,
    variants: tuple[str, ...] | None = None,
    skip: int = 0,
) -> EvalReport:
    """Mine ``limit`` bug-fix commits (after the newest ``skip``); score every ranking mode
    on them (file level) and every pack variant at every budget (edit-site recall)."""
    from hybrid.context.pack import fill_pack
    from hybrid.context.ranking import rank
    from hybrid.context.repomap import load_graph
    from hybrid.context.symbols import rank_symbols, rerank_files

    chosen_variants = [v for v in VARIANTS if variants is None or v in variants]
    repo_path = Path(repo).resolve()
    cases = mine_cases(repo_path, limit, skip=skip)
    if not cases:
        raise ContextError(f"no bug-fix commits that modify source files found in {repo}")
    cache = cache if cache is not None else TagCache()
    tmp = Path(tempfile.mkdtemp(prefix="hybrid-eval-"))
    worktree = tmp / "wt"
    results: list[CaseResult] = []
    # The worktree is registered in hybrid.git's shadow of the repository, pinned until the end.
    pin = contextlib.ExitStack()
    pin.enter_context(git.pinned(repo_path))
    try:
        git_checked(
            repo_path, "worktree", "add", "--detach", "--quiet", str(worktree), cases[0].parent
        )
        for n, case in enumerate(cases):
            git_checked(worktree, "checkout", "--quiet", "--detach", "--force", case.parent)
            graph = load_graph(worktree, cache=cache)
            history = recent_changes(worktree)  # the parent's own past: no leakage
            similar = similar_changes(worktree, case.task)
            grep = partial(grep_words, worktree)
            ranks: dict[str, int] = {}
            top: list[str] = []
            hunks = source_hunks(graph, fix_hunks(repo_path, case))
            covered: dict[str, dict[int, int]] = {}
            for mode in MODES:
                ranking = rank(graph, case.task, mode, history, grep, similar)  # type: ignore[arg-type]
                ranks[mode] = _first_gold(graph, ranking.order, case.gold)
                if mode == "fused":
                    top = [graph.paths[i] for i in ranking.order[:5]]
                for variant, (v_mode, symbols, ablate) in VARIANTS.items():
                    scored = bool(hunks) and variant in chosen_variants
                    if v_mode != mode or not (scored or variant == "full"):
                        continue
                    hits = rank_symbols(graph, ranking, worktree, ablate=ablate) if symbols else []
                    if variant == "full":  # the files as the pack orders them: by symbols too
                        ranks["full"] = _first_gold(
                            graph, rerank_files(graph, ranking, hits).order, case.gold
                        )
                    if scored:
                        covered[variant] = {
                            b: covered_hunks(
                                fill_pack(
                                    graph,
                                    ranking,
                                    worktree,
                                    case.task,
                                    b,
                                    symbols=symbols,
                                    hits=hits,
                                ),
                                hunks,
                            )
                            for b in budgets
                        }
            results.append(
                CaseResult(
                    commit=case.commit[:12],
                    subject=case.task.splitlines()[0][:100] if case.task else "",
                    gold=case.gold,
                    rank=ranks,
                    top=top,
                    hunks=len(hunks),
                    covered=covered,
                )
            )
            if progress:
                progress(n + 1, len(cases))
    finally:
        git.run(["worktree", "remove", "--force", str(worktree)], repo_path)
        shutil.rmtree(tmp, ignore_errors=True)
        pin.close()
    metrics = {
        mode: _metrics([r.rank[mode] for r in results])
        for mode in ("full", *MODES)
        if all(mode in r.rank for r in results)
    }
    edit = {v: {b: _edit_metrics(results, v, b) for b in budgets} for v in chosen_variants}
    return EvalReport(
        repo=str(repo), cases=len(results), metrics=metrics, edit=edit, results=results
    )
