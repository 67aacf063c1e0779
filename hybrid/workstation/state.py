"""Host-side state of workstations and snapshots, under ``paths.state_dir``.

The engine's metadata (container and image labels, ``docker inspect``, events) is readable by
anyone who can reach the engine and travels with images, so secret values never go there:
labels carry the spec with every ``env.set`` value replaced by ``REDACTED`` (names kept), and
the values live here, in a 0600 file of a 0700 directory per container
(``workstations/<container id>/``) or per snapshot image (``snapshots/<image id>/``). Other
host-side evidence of a workstation (the diff baseline) lives in the same directory under its
own file names; ``remove`` is the one call that deletes it all when the workstation goes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from hybrid.paths import state_dir
from hybrid.policy import SandboxSpec

REDACTED = "<redacted: kept host side>"
"""What a spec in engine metadata says instead of an ``env.set`` value."""

ENV_FILE = "env.json"


def split_env(spec: SandboxSpec) -> tuple[SandboxSpec, dict[str, str]]:
    """(the spec with ``env.set`` values redacted, the values); a value already REDACTED is not one."""
    values = {k: v for k, v in spec.env.set.items() if v != REDACTED}
    env = spec.env.model_copy(update={"set": dict.fromkeys(spec.env.set, REDACTED)})
    return spec.model_copy(update={"env": env}), values


def with_values(spec: SandboxSpec, values: dict[str, str]) -> SandboxSpec:
    """``spec`` with each REDACTED ``env.set`` value filled from ``values`` where known."""
    filled = {k: values.get(k, v) if v == REDACTED else v for k, v in spec.env.set.items()}
    return spec.model_copy(update={"env": spec.env.model_copy(update={"set": filled})})


def workstation_dir(container_id: str) -> Path:
    """The state directory of one workstation (created 0700)."""
    return state_dir("workstations", _key(container_id))


def snapshot_dir(image_id: str) -> Path:
    """The state directory of one snapshot image (created 0700)."""
    return state_dir("snapshots", _key(image_id))


def save_env(directory: Path, values: dict[str, str]) -> None:
    """Write the secret values atomically (0600): a reader sees the old file or the new one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{ENV_FILE}.", dir=directory)  # mkstemp makes it 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(values, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, directory / ENV_FILE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_env(directory: Path) -> dict[str, str]:
    """The values saved in ``directory`` ({} when there are none: another host, another user)."""
    try:
        data = json.loads((directory / ENV_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): str(v) for k, v in data.items()}


def remove(container_id: str) -> None:
    """Delete a workstation's host-side state (secret values, baseline); idempotent."""
    _remove("workstations", container_id)


def remove_snapshot(image_id: str) -> None:
    """Delete a snapshot's host-side state; idempotent."""
    _remove("snapshots", image_id)


def _remove(kind: str, engine_id: str) -> None:
    with contextlib.suppress(ValueError):  # not an engine id: nothing of ours is named so
        shutil.rmtree(state_dir(kind) / _key(engine_id), ignore_errors=True)


def _key(engine_id: str) -> str:
    # Image ids come as "sha256:<hex>"; either kind is a bare hex name on disk.
    key = engine_id.rpartition(":")[2]
    if not key or not all(c in "0123456789abcdef" for c in key):
        raise ValueError(f"not an engine id: {engine_id!r}")
    return key
