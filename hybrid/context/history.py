"""Recent change history: files a project changed lately are likelier to change again."""

from __future__ import annotations

import subprocess
from pathlib import Path

RECENT_COMMITS = 100
DECAY = 0.97


def recent_changes(root: str | Path, commits: int = RECENT_COMMITS) -> dict[str, float]:
    """Path (relative to ``root``) -> recency-weighted number of the last ``commits`` commits
    that touched it. Empty outside a git repository; only history up to HEAD is read."""
    try:
        top = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-prefix"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if top.returncode != 0:
            return {}
        prefix = top.stdout.strip()
        out = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "log",
                f"-n{commits}",
                "--no-merges",
                "--name-only",
                "--format=%x00",
            ],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    if out.returncode != 0:
        return {}
    churn: dict[str, float] = {}
    for age, block in enumerate(out.stdout.split("\x00")[1:]):
        weight = DECAY**age
        for name in block.split("\n"):
            name = name.strip()
            if name.startswith(prefix) and name:
                rel = name[len(prefix) :]
                churn[rel] = churn.get(rel, 0.0) + weight
    return churn
