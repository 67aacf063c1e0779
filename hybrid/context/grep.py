"""Full-text matches for task words that no symbol name, docstring or path contains.

Typos, error messages and words from comments are exactly what a bug report quotes and what
the symbol index does not hold. ``git grep`` finds them in the checkout in tens of
milliseconds, so they are looked up at query time instead of indexing every word.
"""

from __future__ import annotations

from pathlib import Path

from hybrid.context.git import git_output, repo_prefix

MAX_WORDS = 8


def grep_words(root: str | Path, words: list[str]) -> dict[str, dict[str, int]]:
    """word -> {path relative to ``root``: matches} for whole-word, case-insensitive hits in
    the tracked files of a git checkout; empty outside git or on any failure."""
    words = sorted(set(words))[:MAX_WORDS]
    if not words:
        return {}
    args = ["grep", "-o", "-i", "-w", "-F", "-I", "--full-name", "-z"]
    for word in words:
        args += ["-e", word]
    out = git_output(root, *args, timeout=30, codes=(0, 1))  # 1: no match
    if out is None:
        return {}
    prefix = repo_prefix(root) or ""
    hits: dict[str, dict[str, int]] = {}
    wanted = {w.lower() for w in words}
    for line in out.decode("utf-8", "replace").splitlines():
        path, _, match = line.partition("\0")
        word = match.strip().lower()
        if word not in wanted or not path.startswith(prefix):
            continue
        rel = path[len(prefix) :]
        per_file = hits.setdefault(word, {})
        per_file[rel] = per_file.get(rel, 0) + 1
    return hits
