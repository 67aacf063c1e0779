"""Per-workstation and per-snapshot state on the host (see hybrid.paths.state_dir).

One directory per engine object, keyed by its id: ``workstations/<container id>`` and
``snapshots/<image id>``. It goes when the object goes (remove, gc), never while it exists.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Literal

from hybrid.paths import state_dir

Kind = Literal["workstations", "snapshots"]


def key(engine_id: str) -> str:
    """The directory name for an engine id (``sha256:`` prefixes dropped)."""
    return engine_id.split(":", 1)[-1]


def directory(kind: Kind, engine_id: str) -> Path:
    """The state directory of one workstation or snapshot, created (0700) on demand."""
    return state_dir(kind, key(engine_id))


def path(kind: Kind, engine_id: str) -> Path:
    """Where the state directory of one workstation or snapshot is (nothing is created)."""
    return state_dir(kind) / key(engine_id)


def forget(kind: Kind, engine_id: str) -> None:
    """Delete one object's state (idempotent)."""
    path = state_dir(kind) / key(engine_id)
    shutil.rmtree(path, ignore_errors=True)


def prune(kind: Kind, alive: set[str]) -> list[str]:
    """Delete the state of every object not in ``alive`` (engine ids); returns the keys removed."""
    keep = {key(i) for i in alive}
    removed = []
    root = state_dir(kind)
    for name in sorted(os.listdir(root)):
        if name not in keep and (root / name).is_dir():
            shutil.rmtree(root / name, ignore_errors=True)
            removed.append(name)
    return removed
