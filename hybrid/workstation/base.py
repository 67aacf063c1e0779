"""The one Workstation protocol every backend (docker runc/runsc, later bwrap, microvm) implements.

A workstation is a long-lived sandbox holding a copy of a repository in one writable
workspace. The router and the CLI only ever hold these two protocols, never a backend class.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import NamedTuple, Protocol, Self, runtime_checkable

from pydantic import BaseModel, Field

from hybrid.policy import SandboxSpec
from hybrid.results import ExecutionResult
from hybrid.workstation.egress import EgressEvent

Runtime = str
"""An OCI runtime of a container tier (hybrid.tiers.container: runc, runsc)."""
# Called with ("stdout" | "stderr", chunk) as output arrives, up to the output budget.
OutputCallback = Callable[[str, bytes], None]


class WorkstationInfo(BaseModel):
    """What `hybrid ws ls` shows about one workstation."""

    name: str
    id: str = Field(description="The backend's id for it (a container id).")
    tier: str = Field(description="docker (runc) or gvisor (runsc).")
    runtime: str
    image: str
    status: str = Field(description="running, exited, created, ...")
    created: str
    persistent: bool = Field(
        description="False for one-shot and library-scoped workstations (gc removes them once their owner is gone)."
    )
    snapshot_of: str | None = Field(None, description="The snapshot it started from, if any.")
    egress_events: int | None = Field(
        None,
        description="Requests its egress proxy logged (see `hybrid ws egress NAME`); None without egress.",
    )


class SnapshotInfo(BaseModel):
    """A committed workstation: image plus workspace, startable many times."""

    name: str
    image: str = Field(description="Image reference to start from (pass as image=).")
    id: str
    source: str = Field(description="Name of the workstation it was taken from.")
    created: str
    size_bytes: int = 0


class AttachCommand(NamedTuple):
    """How a person attaches: run ``argv`` with ``env`` added to its environment.

    ``argv`` names the policy's variables without values (``-e NAME``), so it can be printed or
    logged; ``env`` holds their values (secrets included) and must never be printed.
    """

    argv: list[str]
    env: dict[str, str]


class GcReport(BaseModel):
    """What `gc` removed."""

    containers: list[str] = Field(default_factory=list)
    volumes: list[str] = Field(default_factory=list)
    networks: list[str] = Field(default_factory=list)
    images: list[str] = Field(default_factory=list)


@runtime_checkable
class Workstation(Protocol):
    """A running sandbox with a workspace; a context manager whose close() is idempotent."""

    name: str
    spec: SandboxSpec
    tier: str

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        on_output: OutputCallback | None = None,
    ) -> ExecutionResult:
        """Run ``cmd`` (a shell string or an argv) and return how it ended, output bounded."""
        ...

    def put(self, source: Path | bytes, dest: str) -> None:
        """Copy a host file or directory (or bytes, as a file) to ``dest`` inside."""
        ...

    def get(self, path: str, dest: Path | None = None) -> bytes | None:
        """A file's bytes, or with ``dest`` copy a file or directory out to the host."""
        ...

    def diff(self) -> str:
        """Unified diff (git format, binary-safe) of every change since the repository went in."""
        ...

    def snapshot(self, name: str) -> SnapshotInfo:
        """Commit the workstation (files and installed packages) under ``name``."""
        ...

    def fork(self, n: int) -> Sequence[Workstation]:
        """``n`` new workstations starting from this one's current state."""
        ...

    def info(self) -> WorkstationInfo: ...

    def egress_log(self) -> list[EgressEvent]:
        """Every request made through the egress proxy, allowed or refused (network mode egress)."""
        ...

    def attach_command(self, program: str = "/bin/bash", *, tty: bool = True) -> AttachCommand:
        """What a person runs to get a shell inside (`hybrid ws shell` execs it)."""
        ...

    def stop(self) -> None:
        """Stop every process; the files stay and the next exec starts it again."""
        ...

    def remove(self) -> None:
        """Delete the workstation and its workspace."""
        ...

    def close(self) -> None:
        """Remove it if it was made for this scope only; idempotent."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class Backend(Protocol):
    """Makes, finds and cleans up workstations of one kind."""

    def create(
        self,
        spec: SandboxSpec | None = None,
        *,
        image: str | None = None,
        repo: Path | None = None,
        name: str | None = None,
        persistent: bool = False,
    ) -> Workstation:
        """A new workstation from ``image`` (or a snapshot's image) with ``repo`` copied in."""
        ...

    def open(self, name: str) -> Workstation:
        """An existing workstation by name (WorkstationNotFound if there is none)."""
        ...

    def list(self) -> list[WorkstationInfo]: ...

    def snapshots(self) -> builtins.list[SnapshotInfo]: ...

    def gc(self, everything: bool = False) -> GcReport:
        """Remove what crashed clients left behind (``everything``: all this toolkit made)."""
        ...
