"""Where the toolkit keeps its per-machine state (compiled modules, tag caches, images)."""

from __future__ import annotations

import os
from pathlib import Path


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
