"""Full-text matches for task words that no symbol name, docstring or path contains.

Typos, error messages and words from comments are exactly what a bug report quotes and what
the symbol index does not hold. ``git grep`` finds them in the checkout in tens of
milliseconds, so they are looked up at query time instead of indexing every word.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

MAX_WORDS = 8


def grep_words(root: str | Path, words: list[str]) -> dict[str, dict[str, int]]:
    """word -> {path relative to ``root``: matches} for whole-word, case-insensitive hits in
    the tracked files of a git checkout; empty outside git or on any failure."""
    words = sorted(set(words))[:MAX_WORDS]
    if not words:
        return {}
    cmd = ["git", "-C", str(root), "grep", "-o", "-i", "-w", "-F", "-I", "--full-name", "-z"]
    for word in words:
        cmd += ["-e", word]
    try:
        out = subprocess.run(cmd, capture_output=True, timeout=30)
        prefix = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-prefix"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    if out.returncode not in (0, 1):
        return {}
    hits: dict[str, dict[str, int]] = {}
    wanted = {w.lower() for w in words}
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        path, _, match = line.partition("\0")
        word = match.strip().lower()
        if word not in wanted or not path.startswith(prefix):
            continue
        rel = path[len(prefix) :]
        per_file = hits.setdefault(word, {})
        per_file[rel] = per_file.get(rel, 0) + 1
    return hits
