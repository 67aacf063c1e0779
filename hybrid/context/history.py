"""What a project's git history says about a task.

* ``recent_changes``: files a project changed lately are likelier to change again;
* ``similar_changes``: files that past commits with messages like the task touched
  (history-aware bug localization, as BugLocator): each of the last commits is scored
  against the task with BM25 over its message, and votes, by that score shared among the
  files it touched, for those files.

Only history up to HEAD is read, so at a fix's parent nothing of the fix leaks in.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from hybrid.context.git import git_text
from hybrid.context.text import terms

RECENT_COMMITS = 100
DECAY = 0.97
SIMILAR_COMMITS = 2000  # past commits whose messages are scored against the task
SIMILAR_TOP = 20  # ... of which the most similar vote (all that match: more noise)
SIMILAR_MAX_FILES = 30  # a commit touching more files (a rename, a reformat) does not vote
K1 = 1.2
B = 0.75
_MESSAGE_CHARS = 2000  # of each message: the subject and what explains it


def recent_changes(root: str | Path, commits: int = RECENT_COMMITS) -> dict[str, float]:
    """Path (relative to ``root``) -> recency-weighted number of the last ``commits`` commits
    that touched it. Empty outside a git repository; only history up to HEAD is read."""
    # The newest of the commits ``similar_changes`` reads: one log read serves both.
    churn: dict[str, float] = {}
    for age, commit in enumerate(_past(root, max(commits, SIMILAR_COMMITS)).commits[:commits]):
        weight = DECAY**age
        for rel in commit.files:
            churn[rel] = churn.get(rel, 0.0) + weight
    return churn


class _Commit(NamedTuple):
    sha: str
    words: Counter[str]  # BM25 terms of the message
    length: int  # ... how many
    files: tuple[str, ...]  # touched under the root, relative to it


class _Log(NamedTuple):
    commits: list[_Commit]  # newest first
    postings: dict[str, list[int]]  # term -> the commits whose messages have it
    avg: float  # mean terms per message


# (root, HEAD, commits) -> its past commits: a resident server answers the next task at the
# same HEAD without reading the log again
_PAST: dict[tuple[str, str, int], _Log] = {}
_PAST_KEPT = 2
_EMPTY = _Log([], {}, 1.0)


def _past(root: str | Path, commits: int) -> _Log:
    """The last ``commits`` non-merge commits up to HEAD, newest first. Empty outside a git
    repository (or before its first commit)."""
    where = git_text(root, "rev-parse", "--show-prefix", "HEAD", timeout=30)
    if where is None:
        return _EMPTY
    prefix, _, head = where.partition("\n")
    key = (str(Path(root).resolve()), head.strip(), commits)
    log = _PAST.get(key)
    if log is not None:
        return log
    out = git_text(
        root,
        "log",
        f"-n{commits}",
        "--no-merges",
        "--no-renames",
        "--name-only",
        "--format=%x00%H%x01%B%x01",
        timeout=60,
    )
    found: list[_Commit] = []
    for record in (out or "").split("\x00")[1:]:
        sha, _, rest = record.partition("\x01")
        message, _, names = rest.partition("\x01")
        words = terms(message[:_MESSAGE_CHARS])
        files = tuple(
            name[len(prefix) :]
            for name in (x.strip() for x in names.split("\n"))
            if name and name.startswith(prefix)
        )
        found.append(_Commit(sha, Counter(words), len(words), files))
    postings: dict[str, list[int]] = {}
    for k, c in enumerate(found):
        for t in c.words:
            postings.setdefault(t, []).append(k)
    log = _Log(found, postings, sum(c.length for c in found) / (len(found) or 1) or 1.0)
    if out is not None:
        if len(_PAST) >= _PAST_KEPT:
            _PAST.clear()  # atomic: a server's threads may be here at once
        _PAST[key] = log
    return log


def similar_changes(
    root: str | Path, task: str, commits: int = SIMILAR_COMMITS
) -> dict[str, float]:
    """Path -> votes of the ``SIMILAR_TOP`` of the last ``commits`` commits whose messages
    are most like ``task`` (``similar_commits``): each commit's score, shared among the
    files it touched."""
    votes: dict[str, float] = {}
    for _sha, score, files in similar_commits(root, set(terms(task)), commits):
        for name in files:
            votes[name] = votes.get(name, 0.0) + score / len(files)
    return votes


def similar_commits(
    root: str | Path, query: set[str], commits: int = SIMILAR_COMMITS
) -> list[tuple[str, float, tuple[str, ...]]]:
    """The ``SIMILAR_TOP`` of the last ``commits`` commits whose messages are most like the
    task's terms ``query`` (BM25; the newer first among equals), best first: (commit,
    score, files touched). Commits touching more than ``SIMILAR_MAX_FILES`` are left out."""
    if not query:
        return []
    log = _past(root, commits)
    past = log.commits
    n = len(past)
    matched: dict[int, list[str]] = {}
    idf: dict[str, float] = {}
    for t in sorted(query):
        having = log.postings.get(t, [])
        if having:
            idf[t] = math.log(1 + (n - len(having) + 0.5) / (len(having) + 0.5))
        for age in having:
            matched.setdefault(age, []).append(t)
    scored: list[tuple[float, int]] = []
    for age, words in sorted(matched.items()):
        c = past[age]
        if not c.files or len(c.files) > SIMILAR_MAX_FILES:
            continue
        norm = K1 * (1 - B + B * c.length / log.avg)
        tf = c.words
        score = sum(idf[t] * tf[t] * (K1 + 1) / (tf[t] + norm) for t in words)
        scored.append((-score, age))
    best = sorted(scored)[:SIMILAR_TOP]
    return [(past[age].sha, -neg, past[age].files) for neg, age in best]
