"""Where the toolkit keeps its per-machine state (compiled modules, tag caches, images)."""

from __future__ import annotations

import os
from pathlib import Path

from hybrid.errors import InvalidInput


def cache_dir(*parts: str) -> Path:
    """The cache directory (``$HYBRID_CACHE_DIR``, else ``$XDG_CACHE_HOME/hybrid``), created on demand."""
    root = os.environ.get("HYBRID_CACHE_DIR")
    if root:
        base = Path(root)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "hybrid"
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_dir(*parts: str) -> Path:
    """Host-side state no sandbox can write (``$HYBRID_STATE_DIR``, else ``$XDG_STATE_HOME/hybrid``).

    Created on demand with mode 0700: it holds evidence (diff baselines) and secret values that
    must never live inside a sandbox or in engine metadata.
    """
    root = os.environ.get("HYBRID_STATE_DIR")
    if root:
        base = Path(root)
    else:
        xdg = os.environ.get("XDG_STATE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".local" / "state") / "hybrid"
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    for made in (base, *[base.joinpath(*parts[: i + 1]) for i in range(len(parts))]):
        if made.stat().st_mode & 0o077:
            made.chmod(0o700)
    return path


def read_input(path: Path, what: str = "file", error: type[InvalidInput] = InvalidInput) -> bytes:
    """Read a file the user named; a missing, directory or unreadable path raises one ``error`` line."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from None
