"""Git queries on a checkout: the one place the context package runs ``git`` (through
``hybrid.git``, so nothing the checkout's own ``.git`` configures runs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hybrid import git
from hybrid.errors import ContextError


def git_output(
    root: str | Path, *args: str, timeout: float = 120, codes: tuple[int, ...] = (0,)
) -> bytes | None:
    """stdout of ``git -C root ARGS``; None when git is missing, times out or exits with a
    status outside ``codes``."""
    try:
        out = git.run(args, root, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode in codes else None


def git_text(root: str | Path, *args: str, timeout: float = 120) -> str | None:
    """``git_output`` as text (undecodable bytes replaced, universal newlines)."""
    try:
        out = _run_text(root, args, timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_checked(root: str | Path, *args: str, timeout: float = 600) -> str:
    """``git_text``, but a failure is a ContextError saying which git command failed and why."""
    try:
        out = _run_text(root, args, timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ContextError(f"git {args[0]} failed: {exc}") from exc
    if out.returncode != 0:
        raise ContextError(f"git {args[0]} failed: {out.stderr.strip()[:300]}")
    return out.stdout


def _run_text(
    root: str | Path, args: tuple[str, ...], timeout: float
) -> subprocess.CompletedProcess[str]:
    return git.run(args, root, timeout=timeout, text=True)


def repo_prefix(root: str | Path) -> str | None:
    """Where ``root`` is inside its repository (``"sub/dir/"``, ``""`` at the top); None
    outside a git repository."""
    out = git_text(root, "rev-parse", "--show-prefix", timeout=30)
    return None if out is None else out.strip()
