"""Workstations: long-lived, hardened sandboxes holding a copy of a repository.

One protocol (``Workstation``, ``Backend``) for every backend; today the Docker engine with runc
(tier ``docker``) or gVisor's runsc (tier ``gvisor``). The Docker SDK is imported only when a
backend is used, so a host without Docker still imports ``hybrid``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hybrid.workstation.base import (
    AttachCommand,
    Backend,
    GcReport,
    SnapshotInfo,
    Workstation,
    WorkstationInfo,
)

if TYPE_CHECKING:
    from hybrid.workstation.docker import DockerBackend, DockerWorkstation


def backend() -> DockerBackend:
    """The workstation backend for this host (the Docker engine)."""
    from hybrid.workstation.docker import DockerBackend

    return DockerBackend()


def create(
    spec: Any = None, *, image: str | None = None, repo: Any = None, **kwargs: Any
) -> DockerWorkstation:
    """A new workstation (see DockerBackend.create); use it as a context manager."""
    return backend().create(spec, image=image, repo=repo, **kwargs)


__all__ = [
    "AttachCommand",
    "Backend",
    "GcReport",
    "SnapshotInfo",
    "Workstation",
    "WorkstationInfo",
    "backend",
    "create",
]
