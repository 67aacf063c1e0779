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
