"""Workstations: long-lived, hardened sandboxes holding a copy of a repository.

One contract (``Workstation``, ``Backend``, and the optional ``Snapshots`` capability) for every
backend. Each tier that keeps workstations names its backend (``Tier.backend()``): today the
Docker engine with runc (tier ``docker``) or gVisor's runsc (tier ``gvisor``). A local backend
for tests is NOT a sandbox and is only used when asked for by name. Backends import their
runtime (the Docker SDK, ...) only when used, so a host without Docker still imports ``hybrid``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, overload

from hybrid.errors import EngineUnavailable, PolicyError, WorkstationNotFound
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
def backend(kind: Literal["docker", "gvisor"] = "docker") -> DockerBackend: ...
@overload
def backend(kind: Literal["local"]) -> LocalBackend: ...
@overload
def backend(kind: str) -> Backend: ...


def backend(kind: str = "docker") -> Backend:
    """The workstation backend of tier ``kind`` (docker by default); ``local`` (host
    processes, not a sandbox, for tests) only when asked for by name."""
    if kind == "local":
        from hybrid.workstation.local import LocalBackend

        return LocalBackend()
    from hybrid import tiers

    made = tiers.get(kind).backend()
    if made is None:
        having = ", ".join(t.name for t in tiers.all_tiers() if t.backend() is not None)
        raise PolicyError(f"tier {kind!r} runs in process and keeps no workstations (use {having})")
    return made


def backends() -> list[Backend]:
    """One backend per kind of workstation, in the registry's order (tiers sharing one, once)."""
    from hybrid import tiers

    made: list[Backend] = []
    for tier in tiers.all_tiers():
        candidate = tier.backend()
        if candidate is not None and all(type(candidate) is not type(b) for b in made):
            made.append(candidate)
    return made


def locate(name: str) -> Workstation:
    """The workstation called ``name``, whichever backend holds it.

    A backend whose engine is down is passed over; if none holds ``name``, WorkstationNotFound
    says which backends could not be asked.
    """
    down: list[EngineUnavailable] = []
    for candidate in backends():
        try:
            return candidate.open(name)
        except WorkstationNotFound:
            continue
        except EngineUnavailable as exc:
            down.append(exc)
    if down and len(down) == len(backends()):
        raise down[0]
    unasked = f" ({len(down)} backend(s) unavailable: {down[0]})" if down else ""
    raise WorkstationNotFound(f"no workstation named {name} (see: hybrid ws ls){unasked}")


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
    "backends",
    "locate",
    "snapshots_of",
    "snapshotting",
]
