"""Fan-out on Ray (the optional ``ray`` extra): many jobs across a cluster's nodes, results in order.

Each node runs its own local tiers: a python-wasm job runs on the node's CPython-in-WASM, a
workstation job on the node's Docker engine, a localization job on the node's tag cache. Jobs
travel in chunks (one Ray task each, like ``PythonPool.map``'s chunks), at most ``window``
chunks ahead of the consumer, and come back in the order given. A chunk whose node (or worker)
dies is submitted again, up to ``retries`` times, and Ray places it on a node that is alive;
a job's own error (a ``HybridError``) is raised as itself.

    from hybrid.fanout import PythonJob, fan_out
    for result in fan_out([PythonJob(source="print(1)")] * 1000, "127.0.0.1:6379"):
        ...
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import logging
import os
import signal
import socket
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from hybrid.errors import EngineUnavailable, HybridError, InvalidInput
from hybrid.policy import SandboxSpec

log = logging.getLogger(__name__)


class _Job(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PythonJob(_Job):
    """run_python on the node's python-wasm tier."""

    kind: Literal["python"] = "python"
    source: str
    tests: str | None = None
    files: dict[str, bytes] = Field(default_factory=dict, description="Input files by name.")
    spec: SandboxSpec | None = Field(None, description="Default: the tier's own.")

    def run(self) -> Any:
        from hybrid.wasm.python import run_python

        return run_python(self.source, self.tests, files=self.files or None, spec=self.spec)


class WorkstationJob(_Job):
    """A command in a fresh workstation on the node's engine, holding a copy of ``repo``."""

    kind: Literal["workstation"] = "workstation"
    command: str | list[str]
    repo: Path | None = Field(None, description="A path on the node (a shared checkout).")
    spec: SandboxSpec = Field(default_factory=lambda: SandboxSpec(tier="docker"))

    def run(self) -> Any:
        from hybrid.workstation import backend

        with backend().create(self.spec, repo=self.repo) as ws:
            return ws.exec(self.command)


class LocalizationJob(_Job):
    """hybrid.context.evaluate (file localization on git history) of ``repo`` on the node."""

    kind: Literal["localization"] = "localization"
    repo: Path = Field(description="A git checkout on the node.")
    limit: int = Field(50, description="Bug-fix commits to mine and score.")

    def run(self) -> Any:
        from hybrid.context import evaluate

        return evaluate(self.repo, self.limit)


Job = Annotated[PythonJob | WorkstationJob | LocalizationJob, Field(discriminator="kind")]


class Runnable(Protocol):
    """Any job: ``run()`` on a node returns its result (the jobs above, or your own, picklable)."""

    def run(self) -> Any: ...


class FanOutReport(BaseModel):
    """Where the chunks ran: filled while ``fan_out`` streams."""

    chunks: int = 0
    retried: int = Field(0, description="Chunks submitted again after their node or worker died.")
    nodes: dict[str, int] = Field(default_factory=dict, description="Node id -> chunks it ran.")


NODE_CPUS = "HYBRID_NODE_CPUS"
"""Set on a node by hybrid.raylocal: the host CPUs that node stands for (comma-separated)."""


def _keep_to_node_cpus() -> None:
    # Several nodes of one host (hybrid.raylocal) model separate machines: a worker stays on its
    # node's CPUs, as PythonPool's workers stay on theirs. Unpinned, the guests' page faults and
    # unmaps flush TLBs across every core and a 2-core host runs half the snippets per second.
    cpus = os.environ.get(NODE_CPUS)
    if cpus:
        with contextlib.suppress(ValueError, OSError):
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


LOOPBACK_LAUNCH = (
    "import ray._private.services as s; s.resolve_ip_for_localhost = lambda host: host; "
    "from ray.scripts.scripts import main; main()"
)
"""``python -c`` source of a ``ray`` command that keeps 127.0.0.1 (see ``_loopback_kept``)."""


@contextlib.contextmanager
def _loopback_kept() -> Iterator[None]:
    """Ray turns a loopback address into the machine's outward one before it connects; a
    cluster on 127.0.0.1 (hybrid.raylocal) listens on loopback alone, so keep it as given."""
    import ray._private.services as services

    saved = services.resolve_ip_for_localhost
    services.resolve_ip_for_localhost = lambda host: host
    try:
        yield
    finally:
        services.resolve_ip_for_localhost = saved


def _run_chunk(jobs: Sequence[Runnable]) -> tuple[str, list[Any]]:
    import ray

    _keep_to_node_cpus()
    node = ray.get_runtime_context().get_node_id()
    return node, [job.run() for job in jobs]


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (once per process); EngineUnavailable if it cannot be reached."""
    try:
        import ray
    except ImportError:
        raise EngineUnavailable("fan-out needs Ray: pip install 'hybrid[ray]'") from None
    if ray.is_initialized():
        return
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise InvalidInput(f"Ray address {address!r}: use HOST:PORT (the head's GCS port)")
    try:
        # Ray's own client retries a dead address for minutes, printing as it goes.
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise EngineUnavailable(f"no Ray cluster at {address}: {exc.strerror or exc}") from None
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    node_ip = ("127.0.0.1" if host == "localhost" else host) if loopback else None
    try:
        # A loopback cluster (hybrid.raylocal) listens on loopback alone: this process joins it
        # there, not from the machine's outward address Ray would pick.
        with _fault_handlers_kept(), _loopback_kept() if loopback else contextlib.nullcontext():
            ray.init(
                address=address,
                logging_level=logging.WARNING,
                log_to_driver=False,
                configure_logging=False,
                _node_ip_address=node_ip,
            )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise EngineUnavailable(f"no Ray cluster at {address}: {exc}") from None


def disconnect() -> None:
    """Leave the Ray cluster (``ray.shutdown``), keeping this process's fault handlers."""
    import ray

    with _fault_handlers_kept():
        ray.shutdown()


@contextlib.contextmanager
def _fault_handlers_kept() -> Iterator[None]:
    """Keep this process's SIGILL/SIGSEGV/SIGBUS/SIGFPE handlers across the block.

    ray.init and ray.shutdown install their crash handlers over them; wasmtime turns a guest's trap into a
    SIGILL or SIGSEGV that its own handler catches, so with Ray's in place an in-process wasm
    trap (a memory bomb hitting its cap) killed the whole process with "Illegal instruction".
    """
    libc = ctypes.CDLL(None, use_errno=True)
    kept = {}
    for sig in (signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE):
        action = ctypes.create_string_buffer(512)  # a struct sigaction, opaque, oversized
        if libc.sigaction(int(sig), None, action) == 0:
            kept[sig] = action
    try:
        yield
    finally:
        for sig, action in kept.items():
            libc.sigaction(int(sig), action, None)


def fan_out(
    jobs: Iterable[Runnable],
    address: str,
    *,
    chunk: int = 8,
    window: int | None = None,
    retries: int = 3,
    report: FanOutReport | None = None,
) -> Iterator[Any]:
    """Run ``jobs`` across the Ray cluster at ``address``; yield each job's result in order.

    ``window`` chunks are in flight at most (default: two per CPU of the cluster). A chunk
    whose node or worker dies is submitted again up to ``retries`` times; after that, and for
    a cluster that cannot be reached, EngineUnavailable.
    """
    if chunk < 1 or retries < 0 or (window is not None and window < 1):
        raise InvalidInput("chunk and window must be at least 1, retries at least 0")
    connect(address)
    import ray
    from ray import exceptions

    # Ray's own retries are off: a retry here is counted, and placed by Ray on a live node.
    remote = ray.remote(max_retries=0, num_cpus=1, scheduling_strategy="SPREAD")(_run_chunk)
    report = report if report is not None else FanOutReport()
    if window is None:
        window = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
    pending: deque[tuple[list[Any], Any, int]] = deque()
    source = iter(jobs)

    def send(batch: list[Any]) -> Any:
        try:
            return remote.remote(batch)
        except TypeError as exc:  # Ray could not pickle a job
            first = str(exc).strip().splitlines()[0]
            raise InvalidInput(f"a job cannot be sent to the cluster: {first}") from None

    def submit_next() -> bool:
        batch = [j for _, j in zip(range(chunk), source, strict=False)]
        if not batch:
            return False
        pending.append((batch, send(batch), 0))
        report.chunks += 1
        return True

    while len(pending) < window and submit_next():
        pass
    while pending:
        batch, ref, tries = pending[0]
        try:
            node, results = ray.get(ref)
        except exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, HybridError):
                raise cause from None
            raise
        except (
            exceptions.WorkerCrashedError,
            exceptions.NodeDiedError,
            exceptions.ObjectLostError,
            exceptions.OwnerDiedError,
            exceptions.RaySystemError,
        ) as exc:
            if tries >= retries:
                raise EngineUnavailable(
                    f"a chunk of {len(batch)} jobs failed {tries + 1} times on the Ray cluster: {exc}"
                ) from None
            log.warning("chunk lost with its node or worker (%s); submitting it again", exc)
            report.retried += 1
            pending[0] = (batch, send(batch), tries + 1)
            continue
        pending.popleft()
        report.nodes[node] = report.nodes.get(node, 0) + 1
        submit_next()
        yield from results


__all__ = [
    "FanOutReport",
    "Job",
    "LocalizationJob",
    "PythonJob",
    "Runnable",
    "WorkstationJob",
    "connect",
    "fan_out",
]
