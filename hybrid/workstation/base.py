"""The workstation contract every backend (docker runc/runsc, local, later bwrap, microvm) implements.

A workstation is a long-lived sandbox holding a copy of a repository in one writable
workspace. The router and the CLI only ever hold these protocols, never a backend class:
``Workstation`` and ``Backend`` are what every backend has; ``SnapshotWorkstation`` and
``Snapshots`` are the optional snapshot capability (``snapshots_of``/``snapshotting`` check for
it and raise a clear WorkstationError when a backend lacks it).
"""

from __future__ import annotations

import builtins
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import NamedTuple, Protocol, Self, runtime_checkable

from pydantic import BaseModel, Field

from hybrid.errors import InvalidInput, WorkstationError
from hybrid.policy import SandboxSpec, check_env, check_text
from hybrid.results import ExecutionResult
from hybrid.workstation.egress import EgressEvent

Runtime = str
"""An OCI runtime of a container tier (hybrid.tiers.container: runc, runsc)."""
# Called with ("stdout" | "stderr", chunk) as output arrives, up to the output budget.
OutputCallback = Callable[[str, bytes], None]
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


def command_argv(cmd: str | Sequence[str]) -> list[str]:
    """The argv of a workstation command: a string runs through ``/bin/sh -c``; empty is refused.

    An element with a NUL byte is refused (InvalidInput): written into a NUL-separated argument
    list (bwrap's ``--args``) the rest of it would become options of the sandbox itself.
    """
    argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    if not argv:
        raise InvalidInput("empty command")
    for i, arg in enumerate(argv):
        check_text(arg, f"command argument {i}", data=True)
    return argv


def exec_args(
    cmd: str | Sequence[str], env: dict[str, str] | None, workdir: str | None
) -> list[str]:
    """command_argv() of ``cmd``, with exec's ``env`` and ``workdir`` checked the same way:
    every backend's exec starts here, so no value reaches a sandbox's command line unchecked."""
    argv = command_argv(cmd)
    check_env(env, "exec env")
    if workdir is not None:
        check_text(workdir, "workdir")
    return argv


def check_path(path: str | os.PathLike[str], what: str) -> str:
    """A file name given to put/get (a workspace path, or a host path): no NUL byte."""
    return check_text(os.fspath(path), what, data=True)


def check_image(image: str | None) -> str | None:
    """An image name given to create(): no control character, and not an option (``-...``)."""
    if image is not None:
        check_text(image, "image")
        if image.startswith("-"):
            raise InvalidInput(f"image: {image!r} is not an image name")
    return image


def check_transfer(inside: str, host: Path | bytes | None) -> None:
    """put/get's arguments: the workspace path and the host path (bytes: content, not a path)."""
    check_path(inside, "workspace path")
    if host is not None and not isinstance(host, bytes):
        check_path(host, "host path")


def check_name(name: str) -> str:
    """Validate a workstation or snapshot name."""
    if not _NAME.match(name):
        raise InvalidInput(
            f"bad name {name!r}: use 1-63 of a-z 0-9 _ . - starting with a letter or digit"
        )
    return name


class ServiceInfo(BaseModel):
    """One service of a workstation, as `hybrid ws ls` shows it."""

    name: str
    kind: str = Field(description="postgres, redis or image.")
    image: str
    port: int | None = Field(description="Its port on the workstation's 127.0.0.1.")
    status: str = Field(description="running, restarting, exited, ... or missing.")


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
    services: list[ServiceInfo] = Field(
        default_factory=list, description="Its services ([[services]] in the policy)."
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
    id: str
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


@runtime_checkable
class SnapshotWorkstation(Workstation, Protocol):
    """A workstation whose backend has the ``Snapshots`` capability."""

    def snapshot(self, name: str, *, ephemeral: bool = False) -> SnapshotInfo:
        """Commit the workstation (files and installed packages) under ``name``; an ephemeral
        snapshot goes with the last workstation started from it."""
        ...

    def fork(self, n: int) -> Sequence[Workstation]:
        """``n`` new workstations starting from this one's current state."""
        ...


@runtime_checkable
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
        lifetime: float | None = None,
    ) -> Workstation:
        """A new workstation from ``image`` with ``repo`` copied in.

        ``lifetime`` (seconds, for one-shot sandboxes): the backend ends it by then, client or
        no client.
        """
        ...

    def open(self, name: str) -> Workstation:
        """An existing workstation by name (WorkstationNotFound if there is none)."""
        ...

    def list(self) -> list[WorkstationInfo]: ...

    def reap(self) -> GcReport:
        """Remove what clients that died left behind (cheap; run once per process)."""
        ...

    def gc(self, everything: bool = False) -> GcReport:
        """Remove what crashed clients left behind (``everything``: all this toolkit made)."""
        ...


@runtime_checkable
class Snapshots(Protocol):
    """The optional snapshot capability of a backend: its workstations are SnapshotWorkstations."""

    def start(
        self,
        snapshot: str,
        *,
        spec: SandboxSpec | None = None,
        name: str | None = None,
        persistent: bool = False,
    ) -> Workstation:
        """A new workstation starting from snapshot ``snapshot`` (its files and packages)."""
        ...

    def snapshots(self) -> builtins.list[SnapshotInfo]: ...

    def remove_snapshot(self, name: str) -> None: ...


def snapshots_of(backend: Backend) -> Snapshots:
    """``backend``'s snapshot capability; WorkstationError if it has none."""
    if not isinstance(backend, Snapshots):
        raise WorkstationError(f"the {_kind(backend)} backend has no snapshots")
    return backend


def snapshotting(workstation: Workstation) -> SnapshotWorkstation:
    """``workstation`` as one that snapshots and forks; WorkstationError if its backend cannot."""
    if not isinstance(workstation, SnapshotWorkstation):
        raise WorkstationError(
            f"workstation {workstation.name} ({workstation.tier}) cannot snapshot or fork: "
            "its backend has no snapshots"
        )
    return workstation


def _kind(backend: object) -> str:
    return type(backend).__name__.removesuffix("Backend").lower() or "this"
