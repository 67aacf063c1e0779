"""Recent change history: files a project changed lately are likelier to change again."""

from __future__ import annotations

from pathlib import Path

from hybrid.context.git import git_text, repo_prefix

RECENT_COMMITS = 100
DECAY = 0.97


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
