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

from hybrid.context.git import git_text, repo_prefix
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
    prefix = repo_prefix(root)
    if prefix is None:
        return {}
    out = git_text(
        root, "log", f"-n{commits}", "--no-merges", "--name-only", "--format=%x00", timeout=60
    )
    if out is None:
        return {}
    churn: dict[str, float] = {}
    for age, block in enumerate(out.split("\x00")[1:]):
        weight = DECAY**age
        for name in block.split("\n"):
            name = name.strip()
            if name.startswith(prefix) and name:
                rel = name[len(prefix) :]
                churn[rel] = churn.get(rel, 0.0) + weight
    return churn


class _Commit(NamedTuple):
    sha: str
    words: Counter[str]  # BM25 terms of the message
    length: int  # ... how many
    files: tuple[str, ...]  # touched under the root, relative to it


# (root, HEAD, commits) -> its past commits: a resident server answers the next task at the
# same HEAD without reading the log again
_PAST: dict[tuple[str, str, int], list[_Commit]] = {}
_PAST_KEPT = 2


def _past(root: str | Path, commits: int) -> list[_Commit]:
    """The last ``commits`` non-merge commits up to HEAD, newest first. Empty outside a git
    repository (or before its first commit)."""
    where = git_text(root, "rev-parse", "--show-prefix", "HEAD", timeout=30)
    if where is None:
        return []
    prefix, _, head = where.partition("\n")
    key = (str(Path(root).resolve()), head.strip(), commits)
    found = _PAST.get(key)
    if found is not None:
        return found
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
    found = []
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
    if out is not None:
        while len(_PAST) >= _PAST_KEPT:
            del _PAST[next(iter(_PAST))]
        _PAST[key] = found
    return found


def similar_changes(
    root: str | Path, task: str, commits: int = SIMILAR_COMMITS
) -> dict[str, float]:
    """Path -> votes of the ``SIMILAR_TOP`` of the last ``commits`` commits whose messages
    are most like ``task`` (BM25; the newer first among equals): each commit's score,
    shared among the files it touched."""
    query = set(terms(task))
    if not query:
        return {}
    past = _past(root, commits)
    n = len(past)
    if not n:
        return {}
    df: Counter[str] = Counter()
    for c in past:
        df.update(t for t in c.words if t in query)
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in df}
    avg = sum(c.length for c in past) / n or 1.0
    scored: list[tuple[float, int, tuple[str, ...]]] = []
    for age, c in enumerate(past):
        matched = sorted(t for t in c.words if t in query)
        if not matched or not c.files or len(c.files) > SIMILAR_MAX_FILES:
            continue
        norm = K1 * (1 - B + B * c.length / avg)
        tf = c.words
        score = sum(idf[t] * tf[t] * (K1 + 1) / (tf[t] + norm) for t in matched)
        scored.append((-score, age, c.files))
    votes: dict[str, float] = {}
    for neg, _age, files in sorted(scored, key=lambda s: s[:2])[:SIMILAR_TOP]:
        for name in files:
            votes[name] = votes.get(name, 0.0) - neg / len(files)
    return votes
