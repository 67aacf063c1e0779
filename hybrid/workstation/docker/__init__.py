"""Docker backend (runc or runsc): hardened workstations over the docker SDK.

Every workstation is one container plus one named volume (its workspace, capped at
``budget.disk`` by the loop-mounted image behind it: see disk.py). The root is
read-only, /tmp is a tmpfs, capabilities are all dropped, no-new-privileges is set, pids,
memory and CPU are capped, the network is none and only allow-listed variables are set. The
repository goes in as a copy (put_archive), never a bind mount. All state but secrets lives
in the engine's labels, so any process can find a workstation by name; ``env.set`` values are
redacted there and kept host side (state.py), reaching a process only at exec time.

``network.mode = "egress"`` (runc only: runsc runs with --network=none here) puts the
workstation in a network namespace holding only ``lo``, where 127.0.0.1:3128 leads to one proxy
container that forwards only to the allow-list and logs every request (see proxy.py).

The supervisor deadline kills the whole container (every process, children included) and keeps
the partial output; the workspace volume survives, so the next exec starts it again. Under
gVisor a pids or memory breach kills the whole sandbox: the supervisor notices and reports it.

The package: engine (client, error translation), labels (labels, names, owners),
supervision (exec deadlines and streams), egress, workstation, backend, gc.
"""

from __future__ import annotations

from docker import errors  # callers catch errors.ImageNotFound through this module

from hybrid.workstation.docker.backend import DockerBackend
from hybrid.workstation.docker.egress import egress_log
from hybrid.workstation.docker.engine import client, translate
from hybrid.workstation.docker.gc import disk_gc
from hybrid.workstation.docker.labels import (
    BASE_PATH,
    DEFAULT_USER,
    LABEL_BASE,
    LABEL_DISK,
    LABEL_EPHEMERAL,
    LABEL_KIND,
    LABEL_MANAGED,
    LABEL_NAME,
    LABEL_NETWORK,
    LABEL_OWNER,
    LABEL_PERSISTENT,
    LABEL_RUNTIME,
    LABEL_SNAPSHOT,
    LABEL_SNAPSHOT_OF,
    LABEL_SOURCE,
    LABEL_SPEC,
    LABEL_VOLUME,
    SNAPSHOT_REPOSITORY,
    owner_alive,
    runtime_for,
)
from hybrid.workstation.docker.workstation import DockerWorkstation

__all__ = [
    "BASE_PATH",
    "DEFAULT_USER",
    "LABEL_BASE",
    "LABEL_DISK",
    "LABEL_EPHEMERAL",
    "LABEL_KIND",
    "LABEL_MANAGED",
    "LABEL_NAME",
    "LABEL_NETWORK",
    "LABEL_OWNER",
    "LABEL_PERSISTENT",
    "LABEL_RUNTIME",
    "LABEL_SNAPSHOT",
    "LABEL_SNAPSHOT_OF",
    "LABEL_SOURCE",
    "LABEL_SPEC",
    "LABEL_VOLUME",
    "SNAPSHOT_REPOSITORY",
    "DockerBackend",
    "DockerWorkstation",
    "client",
    "disk_gc",
    "egress_log",
    "errors",
    "owner_alive",
    "runtime_for",
    "translate",
]
