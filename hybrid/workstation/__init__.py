"""Workstations: long-lived, hardened sandboxes holding a copy of a repository.

One contract (``Workstation``, ``Backend``, and the optional ``Snapshots`` capability) for every
backend; today the Docker engine with runc (tier ``docker``) or gVisor's runsc (tier
``gvisor``), plus a local backend for tests that is NOT a sandbox and is only used when asked
for by name. The Docker SDK is imported only when a backend is used, so a host without Docker
still imports ``hybrid``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, overload

from hybrid.workstation.base import (
    AttachCommand,
    Backend,
    GcReport,
    SnapshotInfo,
    Snapshots,
    SnapshotWorkstation,
    Workstation,
    WorkstationInfo,
    snapshots_of,
    snapshotting,
)

if TYPE_CHECKING:
    from hybrid.workstation.docker import DockerBackend
    from hybrid.workstation.local import LocalBackend


@overload
def backend(kind: Literal["docker"] = "docker") -> DockerBackend: ...
@overload
def backend(kind: Literal["local"]) -> LocalBackend: ...


def backend(kind: Literal["docker", "local"] = "docker") -> DockerBackend | LocalBackend:
    """The workstation backend: the Docker engine, unless ``local`` (host processes, not a
    sandbox, for tests) is asked for explicitly."""
    if kind == "local":
        from hybrid.workstation.local import LocalBackend

        return LocalBackend()
    from hybrid.workstation.docker import DockerBackend

    return DockerBackend()


__all__ = [
    "AttachCommand",
    "Backend",
    "GcReport",
    "SnapshotInfo",
    "SnapshotWorkstation",
    "Snapshots",
    "Workstation",
    "WorkstationInfo",
    "backend",
    "snapshots_of",
    "snapshotting",
]
