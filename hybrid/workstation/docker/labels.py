"""Labels, names and owners: all workstation state but secrets lives in engine labels."""

from __future__ import annotations

import contextlib
import os
import socket
from typing import TYPE_CHECKING

from hybrid.errors import EngineUnavailable, InvalidInput, WorkstationError
from hybrid.owner import mark_alive
from hybrid.owner import start_time as _start_time
from hybrid.tiers.container import runtime_of, tier_of
from hybrid.workstation import jobuser
from hybrid.workstation.base import ServiceInfo, SnapshotInfo, WorkstationInfo
from hybrid.workstation.docker.egress import egress_log

if TYPE_CHECKING:
    from typing import Any

    from hybrid.policy import SandboxSpec
    from hybrid.workstation.base import Runtime


LABEL_MANAGED = "hybrid.managed"
LABEL_KIND = "hybrid.kind"
LABEL_NAME = "hybrid.name"
LABEL_PERSISTENT = "hybrid.persistent"
LABEL_OWNER = "hybrid.owner"
LABEL_SPEC = "hybrid.spec"
LABEL_RUNTIME = "hybrid.runtime"
LABEL_VOLUME = "hybrid.volume"
LABEL_BASE = "hybrid.base-image"
LABEL_SNAPSHOT = "hybrid.snapshot"
LABEL_SNAPSHOT_OF = "hybrid.snapshot-of"
LABEL_SOURCE = "hybrid.source"
LABEL_EPHEMERAL = "hybrid.ephemeral"
LABEL_NETWORK = "hybrid.network"
LABEL_DISK = "hybrid.disk"
LABEL_SERVICE = "hybrid.service"
LABEL_SERVICES = "hybrid.services"
SNAPSHOT_REPOSITORY = "hybrid-snapshot"
DEFAULT_USER = jobuser.USER
"""Who a workstation's commands run as: ids no host account has (hybrid.workstation.jobuser)."""
# A dependency layer's venv and node tools come first (hybrid.deps.layers); absent elsewhere.
BASE_PATH = "/opt/hybrid/venv/bin:/opt/hybrid/node/node_modules/.bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_RUNSC_PIDS_BASE = 64
_RUNSC_PIDS_PER_TASK = 16


def _owner() -> str:
    # host:pid:start-time, so gc can tell a live owner from a recycled pid.
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def owner_alive(owner: str) -> bool:
    """Whether the process that labelled something ``owner`` still runs (other hosts: assume yes)."""
    return mark_alive(owner)


def runtime_for(spec: SandboxSpec) -> Runtime:
    """The OCI runtime of the spec's container tier (runc for auto)."""
    return runtime_of(spec.tier)


def _base_env(spec: SandboxSpec) -> dict[str, str]:
    env = {"PATH": BASE_PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}
    if spec.network.mode == "egress":
        from hybrid.workstation.proxy import PORT

        url = f"http://127.0.0.1:{PORT}"
        for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env[key] = url
        env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1"
    if spec.services:
        from hybrid.workstation.services import environment

        env.update(environment(spec.services))
    return env


def _host_pids(pids: int, runtime: str) -> int:
    # gVisor's sentry holds ~50 host threads idle and ptrace adds ~13 per guest process, all
    # counted by the host pids cgroup: scale the cap so it still means "about N processes".
    return pids if runtime == "runc" else _RUNSC_PIDS_BASE + _RUNSC_PIDS_PER_TASK * pids


def _info(attrs: dict[str, Any]) -> WorkstationInfo:
    labels = attrs["Config"]["Labels"]
    runtime = labels.get(LABEL_RUNTIME, "runc")
    return WorkstationInfo(
        name=labels.get(LABEL_NAME, ""),
        id=attrs["Id"],
        tier=tier_of(runtime),
        runtime=runtime,
        image=attrs["Config"]["Image"],
        status=attrs["State"]["Status"],
        created=attrs["Created"],
        persistent=labels.get(LABEL_PERSISTENT) == "1",
        snapshot_of=labels.get(LABEL_SNAPSHOT_OF) or None,
        egress_events=_egress_count(labels),
        services=_services(labels),
    )


def _services(labels: dict[str, str]) -> list[ServiceInfo]:
    if '"services":[]' in labels.get(LABEL_SPEC, '"services":[]'):
        return []  # the common case, without an engine call
    from hybrid.policy import SandboxSpec
    from hybrid.workstation.docker.services import infos

    with contextlib.suppress(WorkstationError, EngineUnavailable, ValueError):
        spec = SandboxSpec.model_validate_json(labels[LABEL_SPEC])
        return infos(labels.get(LABEL_NAME, ""), spec)
    return []


def _egress_count(labels: dict[str, str]) -> int | None:
    if not labels.get(LABEL_NETWORK, "").endswith("-relay"):
        return None
    with contextlib.suppress(WorkstationError, EngineUnavailable):
        return len(egress_log(labels.get(LABEL_NAME, "")))
    return None


def _snapshot_info(name: str, attrs: dict[str, Any]) -> SnapshotInfo:
    labels = attrs["Config"].get("Labels") or {}
    return SnapshotInfo(
        name=name,
        image=f"{SNAPSHOT_REPOSITORY}:{name}",
        id=attrs["Id"],
        source=labels.get(LABEL_SOURCE, ""),
        created=attrs.get("Created", ""),
        size_bytes=attrs.get("Size", 0),
    )


def _owner_ids(user: str) -> tuple[int, int]:
    uid, _, gid = user.partition(":")
    try:
        return int(uid), int(gid or uid)
    except ValueError:
        raise InvalidInput(f"user must be numeric UID:GID, got {user!r}") from None
