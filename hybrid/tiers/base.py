"""The ``Tier`` protocol every execution tier implements, and the helpers tiers share.

Kept free of pydantic, wasmtime and the Docker SDK at import time: ``hybrid.policy`` and the
CLI's option lists read the registry, and neither may pay for a runtime it does not use.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, runtime_checkable

from hybrid.errors import InvalidInput

if TYPE_CHECKING:
    from hybrid.policy import SandboxSpec
    from hybrid.results import ExecutionResult
    from hybrid.router import Job
    from hybrid.workstation.base import Backend, Workstation

OutputCallback = Callable[[str, bytes], None]


@dataclass(frozen=True)
class TierLimits:
    """The largest budget a tier can honour on this host."""

    wall_seconds: float
    memory: int
    fuel: int | None
    pids: int | None
    cpus: float
    output_bytes: int
    network: bool
    disk: int


class Probe(NamedTuple):
    """Whether this host can run a tier: what was found, or why not and how to enable it."""

    available: bool
    detail: str
    fix: str = ""


@runtime_checkable
class Tier(Protocol):
    """One execution tier. Adding a tier is a module implementing this plus one registry line.

    ``minimums`` are the smallest budgets (by Budget field) the tier can start anything in,
    each with the reason; ``egress_refusal`` is why the tier refuses egress on this host even
    though it has a network (None: it does not); ``streams`` says whether ``run`` delivers
    output live through ``on_output``.
    """

    @property
    def name(self) -> str: ...

    @property
    def minimums(self) -> Mapping[str, tuple[float, str]]: ...

    @property
    def egress_refusal(self) -> str | None: ...

    @property
    def streams(self) -> bool: ...

    def limits(self) -> TierLimits:
        """The largest budgets this tier honours on this host."""
        ...

    def misfit(self, job: Job) -> str | None:
        """Why ``job`` does not fit this tier (None when it does), ignoring host availability."""
        ...

    def reasons(self, job: Job) -> list[str]:
        """Why this tier honours ``job`` (for the router's explanation)."""
        ...

    def probe(self, deep: bool = False) -> Probe:
        """Whether this host can run the tier; ``deep`` also runs something. Never raises."""
        ...

    def run(
        self, job: Job, spec: SandboxSpec, on_output: OutputCallback | None = None
    ) -> ExecutionResult:
        """Run ``job`` under ``spec`` (already routed here) and return its result."""
        ...

    def backend(self) -> Backend | None:
        """The workstation backend behind this tier; None for a tier that runs in process."""
        ...


# -- helpers the tiers share --------------------------------------------------------------------


def host_memory() -> int:
    """This host's physical memory in bytes."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 4 * 1024**3


@functools.cache
def host_disk() -> int:
    """The size of the filesystem holding the state directory (workspace images live there)."""
    # The workspace images are sparse files on the filesystem that holds the home directory
    # (where the state directory is): a cap beyond its size could never be honoured.
    try:
        stat = os.statvfs(os.path.expanduser("~"))
        return stat.f_frsize * stat.f_blocks
    except OSError:
        return 64 * 1024**3


def needs_beyond(job: Job, *, python_toolchain: bool = False) -> list[str]:
    """The traits of ``job`` only a process tier gives (``python_toolchain``: python is here)."""
    toolchain = (
        job.toolchain not in (None, "python") if python_toolchain else job.toolchain is not None
    )
    return [
        name
        for flag, name in (
            (job.needs_processes, "processes"),
            (job.needs_services, "services"),
            (job.repo_wide or job.repo is not None, "repository-wide files"),
            (toolchain, f"the {job.toolchain} toolchain"),
        )
        if flag
    ]


def run_in(ws: Workstation, job: Job, on_output: OutputCallback | None) -> ExecutionResult:
    """Run ``job`` in a fresh workstation: its command, or its snippet (and tests) as a file."""
    snippet = job.snippet()
    if snippet is not None and not job.command:
        source = snippet + ("\n\n" + job.tests if job.tests else "") + "\n"
        ws.put(source.encode(), ".hybrid-job.py")
        return ws.exec(["python3", ".hybrid-job.py"], on_output=on_output)
    if not job.command:
        raise InvalidInput("nothing to run (give a command or a Python snippet)")
    return ws.exec(job.command, on_output=on_output)


def with_job_user(detail: str) -> Probe:
    """A process tier's probe: ``detail`` and the host ids its jobs run as; unavailable when a
    host account, group or subordinate range holds them (hybrid.workstation.jobuser)."""
    from hybrid.workstation import jobuser

    found = jobuser.holders()
    if found:
        return Probe(
            False,
            f"{detail}; jobs run as uid {jobuser.JOB_UID} gid {jobuser.JOB_GID}, but "
            + "; ".join(found),
            "set HYBRID_JOB_UID and HYBRID_JOB_GID to ids no host account has",
        )
    return Probe(True, f"{detail}; {jobuser.describe()}")


def network_misfit(job: Job, has_network: bool, missing: str = "") -> str | None:
    """Why the job's network needs do not fit (``missing``: the answer of a tier without one)."""
    if not (job.needs_network or job.spec.network.mode == "egress"):
        return None
    if not has_network:
        return missing
    if job.spec.network.mode != "egress" or not job.spec.network.allow:
        return 'network needs network.mode = "egress" with an allow-list (--allow HOST)'
    return None


_probe_session: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "hybrid_probe_session", default=None
)
T = TypeVar("T")


@contextlib.contextmanager
def probe_session() -> Iterator[None]:
    """Within this block, tiers share what they probe once (one engine ping for two runtimes)."""
    token = _probe_session.set({})
    try:
        yield
    finally:
        _probe_session.reset(token)


def shared(key: str, make: Callable[[], T]) -> T:
    """``make()``, memoized for the current probe_session (uncached outside one)."""
    session = _probe_session.get()
    if session is None:
        return make()
    if key not in session:
        session[key] = make()
    value: T = session[key]
    return value
