"""Workstations kept as one directory each under the state root (local, bwrap, microvm).

A home is ``<state>/<kind>/<name>`` (mode 0700) holding ``meta.json``, written when the
workstation is made; a backend of this kind finds, lists and collects its workstations through
these functions and keeps only what is its own (how to boot one, how to remove one).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hybrid import owner
from hybrid.errors import WorkstationError, WorkstationNotFound
from hybrid.workstation.base import check_name

META = "meta.json"


def make(root: Path, name: str) -> Path:
    """The new, empty home of workstation ``name`` (WorkstationError if the name is taken)."""
    home = root / check_name(name)
    try:
        home.mkdir(mode=0o700)
    except FileExistsError:
        raise WorkstationError(f"a workstation named {name} already exists") from None
    return home


def write_meta(home: Path, meta: dict[str, Any]) -> None:
    (home / META).write_text(json.dumps(meta))


def read_meta(home: Path) -> dict[str, Any]:
    """The home's ``meta.json`` (OSError or ValueError when it is missing or torn)."""
    meta: dict[str, Any] = json.loads((home / META).read_text())
    return meta


def find(root: Path, name: str) -> Path:
    """The home of the workstation ``name`` (WorkstationNotFound if there is none)."""
    home = root / check_name(name)
    if not (home / META).is_file():
        raise WorkstationNotFound(f"no workstation named {name}")
    return home


def every(root: Path) -> list[Path]:
    """Every home with its ``meta.json``, by name."""
    return [home for home in sorted(root.iterdir()) if (home / META).is_file()]


def collectable(root: Path, everything: bool) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(home, meta) of what gc removes: every home with ``everything``, else the non-persistent
    ones whose owner is gone. A home whose meta cannot be read is left alone."""
    for home in sorted(root.iterdir()):
        with contextlib.suppress(OSError, ValueError, KeyError):
            meta = read_meta(home)
            if everything or (not meta["persistent"] and not owner.mark_alive(meta["owner"])):
                yield home, meta
