"""Host-side state of workstations and snapshots, under ``paths.state_dir``.

One 0700 directory per engine object, keyed by its id: ``workstations/<container id>`` and
``snapshots/<image id>``. It holds what no sandbox may write and no engine metadata may carry:
the diff baseline (baseline.py) and the ``env.set`` values. The engine's metadata (labels,
``docker inspect``, events) is readable by anyone who can reach the engine and travels with
images, so labels carry the spec with every ``env.set`` value replaced by ``REDACTED`` (names
kept), and the values live here in a 0600 file. A directory goes when its object goes (remove,
gc), never while it exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from hybrid.paths import state_dir
from hybrid.policy import SandboxSpec

Kind = Literal["workstations", "snapshots"]

REDACTED = "<redacted: kept host side>"
"""What a spec in engine metadata says instead of an ``env.set`` value."""

ENV_FILE = "env.json"


def key(engine_id: str) -> str:
    """The directory name for an engine id (``sha256:`` prefixes dropped); ValueError if not one."""
    name = engine_id.rpartition(":")[2]
    if not name or not all(c in "0123456789abcdef" for c in name):
        raise ValueError(f"not an engine id: {engine_id!r}")
    return name


def directory(kind: Kind, engine_id: str) -> Path:
    """The state directory of one workstation or snapshot, created (0700) on demand."""
    return state_dir(kind, key(engine_id))


def path(kind: Kind, engine_id: str) -> Path:
    """Where the state directory of one workstation or snapshot is (nothing is created)."""
    return state_dir(kind) / key(engine_id)


def forget(kind: Kind, engine_id: str) -> None:
    """Delete one object's state: baseline, secret values (idempotent)."""
    with contextlib.suppress(ValueError):  # not an engine id: nothing of ours is named so
        shutil.rmtree(state_dir(kind) / key(engine_id), ignore_errors=True)


def prune(kind: Kind, alive: set[str]) -> list[str]:
    """Delete the state of every object not in ``alive`` (engine ids); returns the keys removed."""
    keep = {i.rpartition(":")[2] for i in alive}
    removed = []
    root = state_dir(kind)
    for name in sorted(os.listdir(root)):
        if name not in keep and (root / name).is_dir():
            shutil.rmtree(root / name, ignore_errors=True)
            removed.append(name)
    return removed


def split_env(spec: SandboxSpec) -> tuple[SandboxSpec, dict[str, str]]:
    """(the spec with ``env.set`` values redacted, the values); a value already REDACTED is not one."""
    values = {k: v for k, v in spec.env.set.items() if v != REDACTED}
    env = spec.env.model_copy(update={"set": dict.fromkeys(spec.env.set, REDACTED)})
    return spec.model_copy(update={"env": env}), values


def with_values(spec: SandboxSpec, values: dict[str, str]) -> SandboxSpec:
    """``spec`` with each REDACTED ``env.set`` value filled from ``values`` where known."""
    filled = {k: values.get(k, v) if v == REDACTED else v for k, v in spec.env.set.items()}
    return spec.model_copy(update={"env": spec.env.model_copy(update={"set": filled})})


def save_env(where: Path, values: dict[str, str]) -> None:
    """Write the secret values atomically (0600): a reader sees the old file or the new one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{ENV_FILE}.", dir=where)  # mkstemp makes it 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(values, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, where / ENV_FILE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_env(where: Path) -> dict[str, str]:
    """The values saved in ``where`` ({} when there are none: another host, another user)."""
    try:
        data = json.loads((where / ENV_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): str(v) for k, v in data.items()}
