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
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import math
import os
import secrets
import shlex
import shutil
import socket
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any, Self

import docker
from docker import errors
from docker.types import DriverConfig, LogConfig
from docker.types import Mount as DockerMount

from hybrid.errors import (
    EngineUnavailable,
    InvalidInput,
    PolicyViolation,
    WorkstationError,
    WorkstationNotFound,
)
from hybrid.owner import alive as _alive_since
from hybrid.owner import start_time as _start_time
from hybrid.policy import SandboxSpec, admit, check_input_path
from hybrid.results import ExecutionResult, Termination, Usage
from hybrid.tiers.container import runtime_of, tier_of
from hybrid.workstation import archive, disk, state
from hybrid.workstation.base import (
    AttachCommand,
    GcReport,
    OutputCallback,
    Runtime,
    SnapshotInfo,
    WorkstationInfo,
    check_name,
)
from hybrid.workstation.baseline import Baseline
from hybrid.workstation.egress import EgressEvent, parse_events

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

SNAPSHOT_REPOSITORY = "hybrid-snapshot"
DEFAULT_USER = "1000:1000"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_POLL_SECONDS = 0.5
# The watchdog inside an exec holds its deadline when no client is left to (a killed `hybrid run`):
# `timeout` ends the command a grace after the supervisor would have, then `kill -1` ends every
# other process of the sandbox's user, those that left the process group with setsid included
# (it spares only PID 1 and itself). A sandbox without `timeout` runs the command bare.
_WATCHDOG_GRACE = 1.0
_WATCHDOG = (
    'd=$1 e=$2; shift 2; command -v timeout >/dev/null 2>&1 || exec "$@"; '
    'timeout -s KILL "$d" "$@"; s=$?; '
    'if [ $s -eq 137 ] && [ "$(date +%s)" -ge "$e" ]; then kill -KILL -1 2>/dev/null; fi; exit $s'
)
_RUNSC_PIDS_BASE = 64
_RUNSC_PIDS_PER_TASK = 16
# The egress relay and proxy run as nobody; the proxy's request log is capped at 2 x this.
_EGRESS_USER = "65534:65534"
_EGRESS_LOG_SIZE = "1m"

_CLIENT: docker.DockerClient | None = None
_STREAM: docker.APIClient | None = None
_LOCK = threading.Lock()


def client() -> docker.DockerClient:
    """A client for the engine at DOCKER_HOST (default the local socket); EngineUnavailable if none."""
    global _CLIENT
    with _LOCK:
        if _CLIENT is None:
            try:
                made = docker.from_env(timeout=120)
                made.ping()
            except errors.DockerException as exc:
                raise EngineUnavailable(_unreachable(exc)) from None
            _CLIENT = made
        return _CLIENT


def _stream_client() -> docker.APIClient:
    # Exec output streams may stay silent longer than any request timeout; the supervisor
    # enforces the deadline instead, so this client has none.
    global _STREAM
    api = client().api
    with _LOCK:
        if _STREAM is None:
            _STREAM = docker.from_env(timeout=None, version=api.api_version).api
        return _STREAM


def reset_client() -> None:
    """Forget cached clients (after DOCKER_HOST changes)."""
    global _CLIENT, _STREAM
    with _LOCK:
        _CLIENT = _STREAM = None


def _unreachable(exc: BaseException) -> str:
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    return f"no Docker engine at {where} ({first}); start one with scripts/engine.sh"


@contextlib.contextmanager
def translate(what: str = "") -> Iterator[None]:
    """Translate docker.errors.* into the hybrid error family (the one place this happens)."""
    prefix = f"{what}: " if what else ""
    try:
        yield
    except errors.NotFound as exc:
        raise WorkstationNotFound(prefix + _explain(exc)) from None
    except errors.APIError as exc:
        raise WorkstationError(prefix + _explain(exc)) from None
    except errors.DockerException as exc:
        raise EngineUnavailable(prefix + _unreachable(exc)) from None
    except ConnectionError as exc:
        raise EngineUnavailable(prefix + _unreachable(exc)) from None


def _explain(exc: errors.DockerException) -> str:
    if isinstance(exc, errors.APIError) and exc.explanation:
        return str(exc.explanation)
    return str(exc)


def _owner() -> str:
    # host:pid:start-time, so gc can tell a live owner from a recycled pid.
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def owner_alive(owner: str) -> bool:
    """Whether the process that labelled something ``owner`` still runs (other hosts: assume yes)."""
    try:
        host, pid, started = owner.split(":")
    except ValueError:
        return False
    if host != socket.gethostname():
        return True
    return _alive_since(int(pid), started)  # a zombie owner is gone too


def runtime_for(spec: SandboxSpec) -> Runtime:
    """The OCI runtime of the spec's container tier (runc for auto)."""
    return runtime_of(spec.tier)


class DockerWorkstation:
    """One hardened container with a workspace volume; see the module docstring."""

    def __init__(self, container: Any, backend: DockerBackend) -> None:
        labels = container.labels
        self._container = container
        self._backend = backend
        self.id: str = container.id
        self.name: str = labels[LABEL_NAME]
        # The labels' spec has its env.set values redacted; the values are in host-side state.
        self.spec: SandboxSpec = SandboxSpec.model_validate_json(labels[LABEL_SPEC])
        self._secret_env = (
            state.load_env(state.path("workstations", self.id)) if self.spec.env.set else {}
        )
        self.runtime: str = labels.get(LABEL_RUNTIME, "runc")
        self.tier: str = tier_of(self.runtime)
        self.persistent: bool = labels.get(LABEL_PERSISTENT) == "1"
        self.volume: str = labels[LABEL_VOLUME]
        self.base_image: str = labels.get(LABEL_BASE, "")
        self.user: str = container.attrs["Config"].get("User") or DEFAULT_USER
        self._running = container.status == "running"
        self._closed = False

    # -- running commands -------------------------------------------------------------------

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        on_output: OutputCallback | None = None,
    ) -> ExecutionResult:
        """Run ``cmd`` (a shell string or an argv); the deadline kills every process inside."""
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise InvalidInput("empty command")
        deadline = timeout if timeout is not None else self.spec.budget.wall_seconds
        if workdir is not None and not workdir.startswith("/"):
            workdir = f"{self.spec.workspace}/{workdir}"
        environment = self._environment(env)
        limit = self.spec.budget.output_bytes
        api = client().api
        self._ensure_running()

        def create() -> str:
            watched = [
                "/bin/sh",
                "-c",
                _WATCHDOG,
                "hybrid-watchdog",
                f"{deadline + _WATCHDOG_GRACE:.3f}",
                str(int(time.time() + deadline)),
                *argv,
            ]
            return str(
                api.exec_create(
                    self.id,
                    watched,
                    environment=environment,
                    workdir=workdir or self.spec.workspace,
                    user=self.user,
                )["Id"]
            )

        with translate(f"exec in {self.name}"):
            try:
                exec_id = create()
            except errors.APIError as exc:
                if "is not running" not in _explain(exc):
                    raise
                self._running = False
                self._ensure_running()
                exec_id = create()
            start = time.time()
            stream = _ExecStream(_stream_client(), exec_id)
        supervisor = _Supervisor(self, stream, start + deadline)
        out, err = bytearray(), bytearray()
        cut = {"stdout": False, "stderr": False}
        try:
            for kind, chunk in stream:
                buf = out if kind == "stdout" else err
                room = limit - len(buf)
                if len(chunk) > room:
                    cut[kind] = True
                    chunk = chunk[: max(room, 0)]
                if chunk:
                    buf.extend(chunk)
                    if on_output is not None:
                        on_output(kind, bytes(chunk))
        except BaseException:
            # Interrupted (Ctrl-C, SIGTERM) or the reader failed (a closed pipe, a raising
            # on_output): stop every process now rather than orphan them, then re-raise. The
            # stream goes first: the engine would wait ~10 s for output no one reads any more.
            supervisor.stop()
            stream.close()
            self._kill()
            raise
        finally:
            supervisor.stop()
            stream.close()
        wall_ms = (time.time() - start) * 1000
        termination, exit_code, detail = self._classify(
            exec_id, supervisor, start, deadline, bytes(err)
        )
        termination, detail = self._disk_limit(termination, detail, bytes(err))
        if termination in (Termination.OK, Termination.NONZERO_EXIT) and (
            cut["stdout"] or cut["stderr"]
        ):
            termination, detail = Termination.OUTPUT_LIMIT, f"output over {limit} bytes was cut"
        return ExecutionResult(
            tier=self.tier,
            termination=termination,
            exit_code=exit_code,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            stdout_truncated=cut["stdout"],
            stderr_truncated=cut["stderr"],
            usage=Usage(wall_ms=wall_ms),
            detail=detail,
        )

    def _classify(
        self, exec_id: str, supervisor: _Supervisor, start: float, deadline: float, err: bytes
    ) -> tuple[Termination, int | None, str]:
        api = client().api
        with translate(f"exec in {self.name}"):
            try:
                code = api.exec_inspect(exec_id).get("ExitCode")
            except errors.NotFound:
                code = None  # the engine drops exec records when the container stops
            # The watchdog inside may beat the supervisor by a moment on a loaded host.
            overran = code in (None, 137) and time.time() - start >= deadline
            if supervisor.timed_out or overran:
                return (
                    Termination.TIMEOUT,
                    None,
                    f"wall-clock deadline of {deadline:g}s reached; every process was killed",
                )
            died = supervisor.died or (code != 0 and not self._alive())
            if not died and self.runtime == "runsc" and (code == 128 or b"containerManager" in err):
                # gVisor's sentry died under the exec; the engine notices a moment later.
                died = self._dies_within(3.0)
            if died:
                self._running = False
                state = api.inspect_container(self.id)["State"]
                # Under load the OOMKilled flag can lag the kill; the engine's oom event does not.
                if state.get("OOMKilled") or self._oom_since(start):
                    return (
                        Termination.OUT_OF_MEMORY,
                        None,
                        f"memory cap of {self.spec.budget.memory} bytes reached; the sandbox was killed",
                    )
                return (
                    Termination.ERROR,
                    None,
                    f"the sandbox died (exit {state.get('ExitCode')}); under gVisor a pids breach does this",
                )
            if code == 137 and self._oom_since(start):
                return (
                    Termination.OUT_OF_MEMORY,
                    None,
                    f"memory cap of {self.spec.budget.memory} bytes reached",
                )
            if code == 0:
                return Termination.OK, 0, ""
            if code is None:
                return Termination.ERROR, None, "the engine lost the process"
            return Termination.NONZERO_EXIT, code, f"exit status {code}"

    def _disk_limit(
        self, termination: Termination, detail: str, err: bytes
    ) -> tuple[Termination, str]:
        # A full workspace fails writes with ENOSPC: the command exits non-zero, and this says why.
        cap = self.spec.budget.disk_for(self.tier)
        mount = self._container.labels.get(LABEL_DISK)
        return disk.classify(mount, cap, termination, detail, err)

    def _oom_since(self, start: float) -> bool:
        # The kernel's OOM notice can trail the SIGKILL by a moment: look twice.
        for attempt in range(2):
            if attempt:
                time.sleep(0.2)
            events = client().api.events(
                since=f"{start - 0.01:.6f}",
                until=f"{time.time():.6f}",
                filters={"container": self.id, "event": "oom"},
                decode=True,
            )
            if any(True for _ in events):
                return True
        return False

    def _dies_within(self, seconds: float) -> bool:
        end = time.time() + seconds
        while time.time() < end:
            if not self._alive():
                return True
            time.sleep(0.1)
        return False

    def _alive(self) -> bool:
        return bool(client().api.inspect_container(self.id)["State"].get("Running"))

    def _environment(self, extra: dict[str, str] | None) -> dict[str, str]:
        env = _base_env(self.spec)
        env.update(self.spec.env.resolve())
        missing = sorted(set(self.spec.env.set) - set(self._secret_env))
        if missing:
            raise WorkstationError(
                f"{self.name}: the values of env.set {', '.join(missing)} are not on this host "
                f"(they stay in the state directory of the user and host that created it, "
                f"{state.path('workstations', self.id)}); recreate it with its policy here"
            )
        env.update(self._secret_env)
        refused = sorted(set(extra or {}) - set(self.spec.env.allow))
        if refused:
            raise PolicyViolation(
                [f"env: {name} is not on the allow-list (env.allow)" for name in refused]
            )
        env.update(extra or {})
        return env

    def _ensure_running(self) -> None:
        if self._running:
            return
        with translate(f"start {self.name}"):
            client().api.start(self.id)
        self._running = True

    def _kill(self) -> None:
        with contextlib.suppress(errors.DockerException):
            client().api.kill(self.id)
        self._running = False

    # -- files ------------------------------------------------------------------------------

    def put(self, source: Path | bytes, dest: str) -> None:
        """Copy a host file or directory (or bytes, as a file) to ``dest`` inside the workspace.

        Host symlinks travel as symlinks (never followed); a symlink the sandbox planted on
        the way to ``dest`` is replaced by a directory, never written through.
        """
        rel = self._relative(dest)
        later: list[archive.HostEntry] = []
        with tempfile.TemporaryFile() as tmp:
            with tarfile.open(fileobj=tmp, mode="w") as tar:
                owner = _owner_ids(self.user)
                for i in range(1, len(rel.parts)):
                    _add_dir(tar, str(PurePosixPath(*rel.parts[:i])), owner)
                if isinstance(source, bytes):
                    _add_bytes(tar, str(rel), source, owner)
                else:
                    source = Path(source)
                    if not (source.exists() or source.is_symlink()):
                        raise InvalidInput(f"{source}: no such file or directory")
                    entries = archive.walk(source, archive.Everything(), follow_root=False)
                    later = archive.pack(tar, entries, str(rel), owner)
            tmp.seek(0)
            self._put_archive(tmp, later, f"copy into {self.name}")

    def _put_archive(self, tar: Any, links: list[archive.HostEntry], what: str) -> None:
        # The engine extracts as root and follows a symlink it meets on the way. A process
        # inside can swap a directory the engine just made for a symlink (and a fork loop
        # defeats `docker pause`), so the archive goes into a throwaway container holding only
        # the workspace volume: a raced symlink leads into that container's root, never into
        # this workstation's root or its other mounts.
        api = client().api
        with translate(what):
            helper = api.create_container(
                self._container.attrs["Image"],
                command=["true"],
                user=self.user,
                labels={LABEL_MANAGED: "1", LABEL_KIND: "helper", LABEL_OWNER: _owner()},
                network_disabled=True,
                host_config=api.create_host_config(
                    network_mode="none",
                    read_only=True,
                    mounts=[DockerMount(self.spec.workspace, self.volume, type="volume")],
                ),
            )["Id"]
            try:
                api.put_archive(helper, self.spec.workspace, tar)
            finally:
                with contextlib.suppress(errors.DockerException):
                    api.remove_container(helper, force=True)
        if links:
            self._ensure_running()
            # Made by the workstation's own user: whatever it meets there, it can do no more
            # than the sandbox already may.
            pairs = [
                a for link in links for a in (link.target, f"{self.spec.workspace}/{link.path}")
            ]
            script = (
                'while [ $# -gt 1 ]; do rm -f -- "$2"; ln -s -- "$1" "$2" || exit 1; shift 2; done'
            )
            made = self.exec(["/bin/sh", "-c", script, "sh", *pairs])
            if not made.ok:
                raise WorkstationError(
                    f"{what}: making symlinks failed: {made.stderr.strip()[-300:]}"
                )

    def get(self, path: str, dest: Path | None = None) -> bytes | None:
        """A file's bytes, or with ``dest`` copy a file or directory out to the host directory.

        Nothing is written when a member is absolute or a symlink leads outside ``dest``.
        """
        inside = path if path.startswith("/") else f"{self.spec.workspace}/{path}"
        with translate(f"copy out of {self.name}"):
            chunks, _stat = client().api.get_archive(self.id, inside)
            with archive.spool(chunks) as tmp:
                if dest is not None:
                    archive.extract(tmp, Path(dest), f"{self.name}:{path}")
                    return None
                with tarfile.open(fileobj=tmp, mode="r") as tar:
                    member = tar.next()
                    if member is None or not member.isfile():
                        raise InvalidInput(
                            f"{path}: not a regular file (pass dest= to copy a directory)"
                        )
                    data = tar.extractfile(member)
                    return data.read() if data else b""

    def _relative(self, dest: str) -> PurePosixPath:
        workspace = PurePosixPath(self.spec.workspace)
        path = PurePosixPath(dest if dest.startswith("/") else f"{workspace}/{dest}")
        if ".." in path.parts or workspace not in path.parents:
            raise InvalidInput(
                f"{dest}: files go into the workspace {workspace} (the root is read-only)"
            )
        return path.relative_to(workspace)

    def copy_repo(self, repo: Path) -> None:
        """Copy a repository's working tree (tracked + untracked, not ignored, plus .git) in and record the baseline.

        Nothing is read through a symlink: each goes in as a symlink. The baseline (the exact
        bytes that went in) is kept on the host, where the sandbox cannot change it.
        """
        repo = Path(repo)
        if not repo.is_dir():
            raise InvalidInput(f"{repo}: not a directory")
        recorder = self.baseline().recorder()
        with tempfile.TemporaryFile() as tmp:
            with tarfile.open(fileobj=tmp, mode="w") as tar:
                entries = archive.walk(repo, archive.repo_selection(repo))
                later = archive.pack(tar, entries, "", _owner_ids(self.user), recorder)
            tmp.seek(0)
            self._put_archive(tmp, later, f"copy the repository into {self.name}")
        recorder.commit()

    def baseline(self) -> Baseline:
        """What went in (host side); ``diff`` compares the workspace against it."""
        return Baseline.of("workstations", self.id)

    def diff(self) -> str:
        """Unified diff (git format, binary-safe) of every change since the repository went in."""
        with translate(f"diff {self.name}"):
            chunks, _stat = client().api.get_archive(self.id, self.spec.workspace)
            patch = self.baseline().diff(io.BufferedReader(_Chunks(chunks), 1 << 20))
        return patch.decode("utf-8", errors="surrogateescape")

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self, name: str, *, ephemeral: bool = False) -> SnapshotInfo:
        """Commit the workspace (files, installed packages) onto the base image as snapshot ``name``."""
        check_name(name)
        api = client().api
        labels = {
            LABEL_MANAGED: "1",
            LABEL_KIND: "snapshot-builder",
            LABEL_OWNER: _owner(),
        }
        # The root is read-only, so the workspace is the whole state: base image + workspace.
        builder = None
        with translate(f"snapshot {self.name}"):
            try:
                builder = api.create_container(
                    self.base_image,
                    command=["true"],
                    user=self.user,
                    labels=labels,
                    network_disabled=True,
                    host_config=api.create_host_config(network_mode="none"),
                )["Id"]
                # Freeze the processes while the workspace is read, so the snapshot is one
                # consistent moment even if something inside is still writing.
                paused = self._running and self._pause()
                try:
                    chunks, _ = api.get_archive(self.id, self.spec.workspace)
                    parent = str(PurePosixPath(self.spec.workspace).parent)
                    api.put_archive(builder, parent, _Chunks(chunks))
                finally:
                    if paused:
                        api.unpause(self.id)
                image_labels = {
                    LABEL_MANAGED: "1",
                    LABEL_KIND: "snapshot",
                    LABEL_OWNER: "",
                    LABEL_SNAPSHOT: name,
                    LABEL_SOURCE: self.name,
                    LABEL_SPEC: self.spec.model_dump_json(),  # redacted: no env.set values
                    LABEL_RUNTIME: self.runtime,
                    LABEL_BASE: self.base_image,
                    LABEL_EPHEMERAL: "1" if ephemeral else "0",
                }
                image_id = api.commit(
                    builder, repository=SNAPSHOT_REPOSITORY, tag=name, conf={"Labels": image_labels}
                )["Id"]
                self.baseline().copy_to(Baseline.of("snapshots", image_id))
                # The image carries no values: starting from it copies them from here.
                if self._secret_env:
                    state.save_env(state.directory("snapshots", image_id), self._secret_env)
            finally:
                if builder is not None:
                    with contextlib.suppress(errors.DockerException):
                        api.remove_container(builder, force=True)
        return self._backend.snapshot_info(name)

    def _pause(self) -> bool:
        try:
            client().api.pause(self.id)
            return True
        except errors.APIError:
            return False  # not running (a deadline stopped it): nothing can write anyway

    def fork(self, n: int) -> list[DockerWorkstation]:
        """``n`` new workstations starting from this one's current state (one snapshot, n starts)."""
        if n < 1:
            raise InvalidInput(f"fork needs n >= 1, got {n}")
        token = secrets.token_hex(3)
        snap = self.snapshot(f"{self.name}-fork-{token}"[:63], ephemeral=True)
        forks: list[DockerWorkstation] = []
        try:
            for i in range(n):
                forks.append(
                    self._backend.start(
                        snap.name, name=f"{self.name}-{token}-{i}"[:63], persistent=self.persistent
                    )
                )
        except BaseException:
            for made in forks:
                made.remove()
            raise
        return forks

    def attach_command(self, program: str = "/bin/bash", *, tty: bool = True) -> AttachCommand:
        """How to attach a person to this workstation (same user, env and limits).

        The policy's variables (env.set, env.inherit) go in as ``-e NAME`` (docker reads the
        value from its own environment): their values are in ``env``, never in the argv.
        """
        docker_cli = shutil.which("docker")
        if docker_cli is None:
            raise EngineUnavailable(
                "the docker command-line client is needed to attach (apt-get install docker.io)"
            )
        environment = self._environment(None)
        self._ensure_running()
        argv = [docker_cli, "exec", "-it" if tty else "-i", "-u", self.user]
        argv += ["-w", self.spec.workspace]
        private = set(self.spec.env.set) | set(self.spec.env.inherit)
        for key, value in _base_env(self.spec).items():
            if key not in private:
                argv += ["-e", f"{key}={value}"]
        env = {k: v for k, v in environment.items() if k in private}
        for key in env:
            argv += ["-e", key]
        return AttachCommand(argv=[*argv, self.id, program], env=env)

    # -- lifecycle --------------------------------------------------------------------------

    def egress_log(self) -> list[EgressEvent]:
        """Every request this workstation made through its egress proxy, allowed or refused.

        The proxy's container writes it (size-capped by the engine, oldest events dropped
        first); nothing inside the workstation can reach or change it.
        """
        if self.spec.network.mode != "egress":
            raise InvalidInput(f"{self.name} has network mode none: nothing leaves it, no log")
        return egress_log(self.name)

    def info(self) -> WorkstationInfo:
        with translate(f"inspect {self.name}"):
            attrs = client().api.inspect_container(self.id)
        return _info(attrs)

    def stop(self) -> None:
        """Kill every process; the files stay and the next exec starts it again."""
        self._kill()

    def remove(self) -> None:
        """Delete the container, its workspace volume, and its fork snapshot when no one else uses it."""
        self._closed = True
        self._backend.remove_container(self.id, self.volume)

    def close(self) -> None:
        """Remove it unless it is persistent (made by `ws up`); idempotent."""
        if not self._closed and not self.persistent:
            self.remove()
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<DockerWorkstation {self.name} {self.runtime} {self.id[:12]}>"


class _Supervisor:
    """Watches one exec: kills the container at the deadline, and notices a sandbox that died."""

    def __init__(self, ws: DockerWorkstation, stream: _ExecStream, deadline: float) -> None:
        self._ws = ws
        self._stream = stream
        self._deadline = deadline
        self._done = threading.Event()
        self.timed_out = False
        self.died = False
        self._thread = threading.Thread(
            target=self._watch, daemon=True, name=f"hybrid-supervisor-{ws.name}"
        )
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(min(_POLL_SECONDS, max(self._deadline - time.time(), 0.0))):
            if time.time() >= self._deadline:
                self.timed_out = True
                self._ws._kill()
                # Let the last output that was already in flight arrive before cutting the stream.
                self._done.wait(0.2)
                self._close()
                return
            try:
                alive = self._ws._alive()
            except errors.DockerException:
                continue
            if not alive:
                self.died = True
                self._close()
                return

    def _close(self) -> None:
        self._stream.close()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


class _ExecStream:
    """One exec's output, read frame by frame; iterating yields ("stdout"|"stderr", bytes).

    Frames are read through the HTTP response's own buffered reader, not its raw socket as the
    SDK's ``exec_start(stream=True)`` does: a command that prints at once can have its first
    frame arrive in the same packet as the response headers, already inside that buffer, and
    reading the raw socket lost it (a first line missing about once in 60 concurrent runs).
    Iteration ends quietly when the engine ends the stream or ``close`` (from any thread) cuts it.
    """

    def __init__(self, api: docker.APIClient, exec_id: str) -> None:
        response = api._post_json(
            api._url("/exec/{0}/start", exec_id),
            headers={"Connection": "Upgrade", "Upgrade": "tcp"},
            data={"Tty": False, "Detach": False},
            stream=True,
        )
        api._raise_for_status(response)
        self._response = response
        self._reader: io.BufferedReader = response.raw._fp.fp
        self._closed = False

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        while True:
            header = self._read(8)
            if len(header) < 8:
                return
            size = int.from_bytes(header[4:8], "big")
            data = self._read(size)
            if data:
                yield ("stderr" if header[0] == 2 else "stdout"), data
            if len(data) < size:
                return

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size and not self._closed:
            try:
                chunk = self._reader.read1(size - len(data))
            except (OSError, ValueError, AttributeError):
                break  # closed under us (the supervisor) or dropped by the engine
            if not chunk:
                break
            data.extend(chunk)
        return bytes(data)

    def close(self) -> None:
        """Cut the stream (idempotent, safe from another thread): a blocked read returns."""
        self._closed = True
        with contextlib.suppress(Exception):
            self._reader.raw._sock.shutdown(socket.SHUT_RDWR)  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            self._response.close()


class _Chunks(io.RawIOBase):
    """Streams get_archive's chunks into put_archive without holding the tar in memory."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buffer))
        b[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


class DockerBackend:
    """Makes, finds and cleans up Docker workstations (runc or runsc per spec)."""

    def __init__(self, user: str = DEFAULT_USER) -> None:
        self.user = user

    def create(
        self,
        spec: SandboxSpec | None = None,
        *,
        image: str | None = None,
        repo: Path | None = None,
        name: str | None = None,
        persistent: bool = False,
        snapshot_of: str | None = None,
        lifetime: float | None = None,
    ) -> DockerWorkstation:
        """A new hardened workstation from ``image`` (default the base image) with ``repo`` copied in.

        ``lifetime`` (seconds, for one-shot sandboxes) makes the engine itself end the container
        then, client or no client: its PID 1 is a plain ``sleep``, which nothing inside can
        signal or stop (a namespace's init ignores signals it has no handler for).
        """
        from hybrid.workstation.images import BASE_IMAGE

        spec = spec or SandboxSpec(tier="docker")
        runtime = runtime_for(spec)
        tier = tier_of(runtime)
        violations = admit(spec, tier)
        if violations:
            raise PolicyViolation(violations)
        if repo is not None:
            # A repository is an input the user named: the same secret-path rule as a mount.
            check_input_path(repo, "repository")
        name = check_name(name or f"ws-{secrets.token_hex(4)}")
        image = image or BASE_IMAGE
        # Labels are engine metadata (inspect, events, images): they get the spec without values.
        spec, secret_env = state.split_env(spec)
        api = client().api
        with translate(f"create {name}"):
            try:
                image_attrs = api.inspect_image(image)
            except errors.ImageNotFound:
                hint = " (build it with: hybrid image bootstrap)" if image == BASE_IMAGE else ""
                raise WorkstationNotFound(f"no image {image}{hint}") from None
            image_labels = image_attrs.get("Config", {}).get("Labels") or {}
            base = image_labels.get(LABEL_BASE) or image
            labels = {
                LABEL_MANAGED: "1",
                LABEL_KIND: "workstation",
                LABEL_NAME: name,
                LABEL_PERSISTENT: "1" if persistent else "0",
                LABEL_OWNER: _owner(),
                LABEL_SPEC: spec.model_dump_json(),
                LABEL_RUNTIME: runtime,
                LABEL_VOLUME: f"hybrid-{name}-workspace",
                LABEL_BASE: base,
                LABEL_SNAPSHOT_OF: snapshot_of or "",
                LABEL_NETWORK: (
                    f"container:hybrid-{name}-relay" if spec.network.mode == "egress" else ""
                ),
            }
            if api.containers(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_NAME}={name}"]}
            ):
                raise WorkstationError(
                    f"a workstation named {name} exists; pick another name or remove it"
                )
            volume, labels[LABEL_DISK] = self._workspace_volume(labels, spec, tier)
            container_id = None
            try:
                if labels[LABEL_NETWORK]:
                    self._egress(labels, spec)
                if (
                    image_labels.get(LABEL_KIND) not in ("base", "snapshot")
                    or spec.workspace != "/workspace"
                ):
                    self._own_workspace(image, volume, spec)
                host_config = self._host_config(spec, runtime, volume, labels[LABEL_NETWORK])
                if lifetime is not None:
                    # Under docker-init, sleep would be its child, which the sandbox's user can stop.
                    host_config["Init"] = False
                container_id = api.create_container(
                    image,
                    command=["sleep", "infinity" if lifetime is None else f"{math.ceil(lifetime)}"],
                    name=f"hybrid-{name}",
                    # A joined namespace brings its own hostname (the relay's, "workstation").
                    hostname=None if labels[LABEL_NETWORK] else "workstation",
                    user=self.user,
                    working_dir=spec.workspace,
                    environment=_base_env(spec),
                    labels=labels,
                    network_disabled=not labels[LABEL_NETWORK],
                    host_config=host_config,
                )["Id"]
                if secret_env:
                    state.save_env(state.directory("workstations", container_id), secret_env)
                api.start(container_id)
            except BaseException:
                if container_id is not None:
                    with contextlib.suppress(errors.DockerException):
                        api.remove_container(container_id, force=True)
                    state.forget("workstations", container_id)
                with contextlib.suppress(errors.DockerException):
                    api.remove_volume(volume, force=True)
                disk.drop(Path(labels[LABEL_DISK]))
                self._remove_egress(name)
                raise
            ws = DockerWorkstation(client().containers.get(container_id), self)
        if repo is not None:
            try:
                ws.copy_repo(Path(repo))
            except BaseException:
                ws.remove()
                raise
        return ws

    def _workspace_volume(
        self, labels: dict[str, str], spec: SandboxSpec, tier: str
    ) -> tuple[str, str]:
        """The workspace volume, bound to a size-capped mount (see disk.py): (volume, mount)."""
        name = labels[LABEL_VOLUME]
        mount = disk.create(name, spec.budget.disk_for(tier), labels[LABEL_OWNER], owner_alive)
        try:
            created = client().api.create_volume(
                name,
                driver="local",
                driver_opts=disk.volume_options(mount),
                labels={
                    LABEL_MANAGED: "1",
                    LABEL_KIND: "workspace",
                    LABEL_NAME: labels[LABEL_NAME],
                    LABEL_OWNER: labels[LABEL_OWNER],  # gc leaves a live create's volume alone
                },
            )["Name"]
        except BaseException:
            disk.drop(mount)
            raise
        return str(created), str(mount)

    def _egress(self, labels: dict[str, str], spec: SandboxSpec) -> None:
        # Three pieces, so the workstation reaches the proxy and nothing else: a relay container
        # with no network (only lo) whose namespace the workstation joins, forwarding
        # 127.0.0.1:PORT to a unix socket in a tmpfs volume; and the proxy on the default
        # bridge serving that socket. A Docker network would give the host an address (and a
        # default route) the workstation could use; a namespace with only lo has none.
        from hybrid.workstation import proxy
        from hybrid.workstation.images import BASE_IMAGE

        api = client().api
        name = labels[LABEL_NAME]
        owned = {
            LABEL_MANAGED: "1",
            LABEL_NAME: name,
            LABEL_OWNER: labels[LABEL_OWNER],
            LABEL_PERSISTENT: labels[LABEL_PERSISTENT],
        }
        uid, gid = _EGRESS_USER.split(":")
        volume = api.create_volume(
            f"hybrid-{name}-egress",
            driver="local",
            driver_opts={
                "type": "tmpfs",
                "device": "tmpfs",
                "o": f"uid={uid},gid={gid},mode=0700,size=64k",
            },
            labels={**owned, LABEL_KIND: "egress"},
        )["Name"]
        source = Path(proxy.__file__).read_text(encoding="utf-8")
        socket_dir = [DockerMount(proxy.SOCKET_DIR, volume, type="volume")]

        def hardened(**extra: Any) -> dict[str, Any]:
            return dict(
                api.create_host_config(
                    read_only=True,
                    cap_drop=["ALL"],
                    security_opt=["no-new-privileges"],
                    init=True,
                    mounts=socket_dir,
                    restart_policy={"Name": "unless-stopped"},
                    **extra,
                )
            )

        deny = self._host_addresses(source, labels[LABEL_OWNER])
        helper = api.create_container(
            BASE_IMAGE,
            command=["python3", "-c", source, "serve"],
            name=f"hybrid-{name}-proxy",
            user=_EGRESS_USER,
            environment={
                "HYBRID_ALLOW": json.dumps(spec.network.allow),
                "HYBRID_DENY": json.dumps(deny),
            },
            labels={**owned, LABEL_KIND: "proxy"},
            host_config=hardened(
                network_mode="bridge",
                pids_limit=64,
                mem_limit=128 * 1024**2,
                # The request log: the engine keeps it, capped, where the workstation cannot write.
                log_config=LogConfig(
                    type="json-file", config={"max-size": _EGRESS_LOG_SIZE, "max-file": "2"}
                ),
            ),
        )["Id"]
        api.start(helper)
        relay = api.create_container(
            BASE_IMAGE,
            command=["python3", "-c", source, "relay"],
            name=labels[LABEL_NETWORK].removeprefix("container:"),
            hostname="workstation",
            user=_EGRESS_USER,
            labels={**owned, LABEL_KIND: "relay"},
            network_disabled=True,
            host_config=hardened(network_mode="none", pids_limit=32, mem_limit=64 * 1024**2),
        )["Id"]
        api.start(relay)

    def _host_addresses(self, source: str, owner: str) -> list[str]:
        # The proxy must refuse the host's own addresses, global ones included; only a process
        # in the host's network namespace can list them (and this works for a remote engine).
        from hybrid.workstation.images import BASE_IMAGE

        api = client().api
        helper = api.create_container(
            BASE_IMAGE,
            command=["python3", "-c", source, "addresses"],
            user=_EGRESS_USER,
            labels={LABEL_MANAGED: "1", LABEL_KIND: "helper", LABEL_OWNER: owner},
            host_config=api.create_host_config(
                network_mode="host",
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                pids_limit=16,
                mem_limit=64 * 1024**2,
            ),
        )["Id"]
        try:
            api.start(helper)
            status = api.wait(helper, timeout=60)
            out = api.logs(helper, stdout=True, stderr=False)
            if status.get("StatusCode") != 0:
                raise WorkstationError("could not list the host's addresses for the egress proxy")
            return [str(a) for a in json.loads(out)]
        finally:
            with contextlib.suppress(errors.DockerException):
                api.remove_container(helper, force=True)

    def _remove_egress(self, name: str, report: GcReport | None = None) -> None:
        """Remove workstation ``name``'s relay, proxy and socket volume (recorded in ``report``)."""
        api = client().api
        for container in (f"hybrid-{name}-relay", f"hybrid-{name}-proxy"):
            with contextlib.suppress(errors.DockerException):
                api.remove_container(container, force=True)
                if report is not None:
                    report.containers.append(container)
        with contextlib.suppress(errors.DockerException):
            api.remove_volume(f"hybrid-{name}-egress", force=True)
            if report is not None:
                report.volumes.append(f"hybrid-{name}-egress")
        with contextlib.suppress(errors.DockerException):
            api.remove_network(f"hybrid-{name}-net")  # made by earlier versions

    def _host_config(
        self, spec: SandboxSpec, runtime: str, volume: str, network: str = ""
    ) -> dict[str, Any]:
        budget = spec.budget
        mounts = [_workspace_mount(spec.workspace, volume)]
        mounts += [
            DockerMount(
                m.target,
                str(m.source.expanduser().resolve()),
                type="bind",
                read_only=m.mode == "ro",
            )
            for m in spec.mounts
        ]
        tmp_size = min(budget.memory, 1024**3)
        config: dict[str, Any] = client().api.create_host_config(
            runtime=runtime,
            network_mode=network or "none",
            read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={tmp_size},mode=1777"},
            mounts=mounts,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=_host_pids(budget.pids, runtime),
            mem_limit=budget.memory,
            memswap_limit=budget.memory,
            nano_cpus=int(budget.cpus * 1e9),
            init=True,
            ipc_mode="private",
        )
        return config

    def _own_workspace(self, image: str, volume: str, spec: SandboxSpec) -> None:
        # An empty volume takes the owner of whatever sits at its path in the image (root, or a
        # directory the engine makes). Let a one-off container holding CAP_CHOWN and nothing else
        # take that first mount (so any image content is copied up), hand it all to the user and
        # leave it non-empty, so the workstation's own mount copies nothing over it.
        api = client().api
        target = shlex.quote(spec.workspace)
        helper = api.create_container(
            image,
            command=["sh", "-c", f"mkdir -p {target}/.hybrid && chown -R {self.user} {target}"],
            user="0:0",
            labels={LABEL_MANAGED: "1", LABEL_KIND: "helper", LABEL_OWNER: _owner()},
            network_disabled=True,
            host_config=api.create_host_config(
                network_mode="none",
                read_only=True,
                cap_drop=["ALL"],
                cap_add=["CHOWN"],
                security_opt=["no-new-privileges"],
                mounts=[_workspace_mount(spec.workspace, volume)],
            ),
        )["Id"]
        try:
            api.start(helper)
            status = api.wait(helper, timeout=60)
            if status.get("StatusCode") != 0:
                raise WorkstationError(
                    f"could not give {spec.workspace} to user {self.user} in image {image}"
                )
        finally:
            with contextlib.suppress(errors.DockerException):
                api.remove_container(helper, force=True)

    def start(
        self,
        snapshot: str,
        *,
        spec: SandboxSpec | None = None,
        name: str | None = None,
        persistent: bool = False,
    ) -> DockerWorkstation:
        """A new workstation starting from snapshot ``snapshot`` (its files and packages)."""
        info = self.snapshot_info(snapshot)
        if spec is None:
            with translate(f"snapshot {snapshot}"):
                labels = client().api.inspect_image(info.image)["Config"]["Labels"]
            spec = SandboxSpec.model_validate_json(labels[LABEL_SPEC])
        # The image's spec names its env.set variables; their values are in host-side state.
        spec = state.with_values(spec, state.load_env(state.path("snapshots", info.id)))
        made = self.create(
            spec, image=info.image, name=name, persistent=persistent, snapshot_of=snapshot
        )
        try:
            Baseline.of("snapshots", info.id).copy_to(made.baseline())
        except BaseException:
            made.remove()
            raise
        return made

    def open(self, name: str) -> DockerWorkstation:
        """An existing workstation by name."""
        with translate(f"find {name}"):
            found = client().containers.list(
                all=True,
                filters={
                    "label": [
                        f"{LABEL_MANAGED}=1",
                        f"{LABEL_KIND}=workstation",
                        f"{LABEL_NAME}={name}",
                    ]
                },
            )
        if not found:
            raise WorkstationNotFound(f"no workstation named {name} (see: hybrid ws ls)")
        return DockerWorkstation(found[0], self)

    def list(self) -> builtins.list[WorkstationInfo]:
        """Every workstation this toolkit made on the engine."""
        api = client().api
        with translate("list workstations"):
            rows = api.containers(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}=workstation"]}
            )
            return sorted(
                (_info(api.inspect_container(row["Id"])) for row in rows), key=lambda i: i.name
            )

    def snapshot_info(self, name: str) -> SnapshotInfo:
        """The snapshot called ``name``."""
        ref = f"{SNAPSHOT_REPOSITORY}:{check_name(name)}"
        with translate(f"snapshot {name}"):
            try:
                attrs = client().api.inspect_image(ref)
            except errors.ImageNotFound:
                raise WorkstationNotFound(f"no snapshot named {name}") from None
        return _snapshot_info(name, attrs)

    def snapshots(self) -> builtins.list[SnapshotInfo]:
        """Every snapshot this toolkit made."""
        api = client().api
        with translate("list snapshots"):
            images = api.images(filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}=snapshot"]})
            found = []
            for row in images:
                attrs = api.inspect_image(row["Id"])
                name = (attrs["Config"].get("Labels") or {}).get(LABEL_SNAPSHOT, "")
                if f"{SNAPSHOT_REPOSITORY}:{name}" in (attrs.get("RepoTags") or []):
                    found.append(_snapshot_info(name, attrs))
        return sorted(found, key=lambda s: s.name)

    def remove_snapshot(self, name: str) -> None:
        """Delete snapshot ``name`` (its image stays while a workstation still runs from it)."""
        info = self.snapshot_info(name)
        with translate(f"remove snapshot {name}"), contextlib.suppress(errors.APIError):
            client().api.remove_image(info.image, noprune=False)
            state.forget("snapshots", info.id)

    def _gc_egress(self, everything: bool, report: GcReport) -> None:
        # A relay or proxy whose workstation is gone (a crash between removals, or a
        # persistent workstation removed by hand) and whose maker no longer runs (it may still
        # be creating the workstation).
        api = client().api
        names = {
            (row.get("Labels") or {}).get(LABEL_NAME)
            for row in api.containers(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}=workstation"]}
            )
        }
        for kind in ("relay", "proxy"):
            for row in api.containers(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}={kind}"]}
            ):
                labels = row.get("Labels") or {}
                if labels.get(LABEL_NAME) in names and not everything:
                    continue
                if not everything and owner_alive(labels.get(LABEL_OWNER, "")):
                    continue
                with contextlib.suppress(errors.NotFound):
                    api.remove_container(row["Id"], force=True)
                    report.containers.append((row.get("Names") or [row["Id"][:12]])[0].lstrip("/"))

    def remove_container(self, container_id: str, volume: str | None) -> None:
        api = client().api
        image = None
        labels: dict[str, str] = {}
        with translate("remove workstation"), contextlib.suppress(errors.NotFound):
            attrs = api.inspect_container(container_id)
            image = attrs["Config"]["Image"]
            labels = attrs["Config"].get("Labels") or {}
            api.remove_container(container_id, force=True)
        if labels.get(LABEL_NETWORK):
            self._remove_egress(labels[LABEL_NAME])
        if volume:
            _remove_volume(volume)
        state.forget("workstations", container_id)
        if image and image.startswith(f"{SNAPSHOT_REPOSITORY}:"):
            self._drop_if_ephemeral(image)

    def _drop_if_ephemeral(self, image: str) -> None:
        api = client().api
        with contextlib.suppress(errors.DockerException):
            attrs = api.inspect_image(image)
            labels = attrs["Config"].get("Labels") or {}
            if labels.get(LABEL_EPHEMERAL) == "1" and not api.containers(
                all=True, filters={"ancestor": image}
            ):
                api.remove_image(image)
                state.forget("snapshots", attrs["Id"])

    def reap(self) -> GcReport:
        """Remove what dead clients left: their non-persistent containers with their volumes and
        networks. Cheaper and narrower than ``gc``: nothing a live process may still be making."""
        report = GcReport()
        with translate("reap"):
            self._reap(client().api, report, everything=False)
        return report

    def _reap(self, api: docker.APIClient, report: GcReport, everything: bool) -> None:
        for row in api.containers(all=True, filters={"label": f"{LABEL_MANAGED}=1"}):
            labels = row.get("Labels") or {}
            abandoned = labels.get(LABEL_PERSISTENT) != "1" and not owner_alive(
                labels.get(LABEL_OWNER, "")
            )
            if not (everything or abandoned):
                continue
            # APIError too: another process may be reaping the same leftovers right now.
            with contextlib.suppress(errors.APIError):
                api.remove_container(row["Id"], force=True)
                shown = (row.get("Names") or [row["Id"][:12]])[0].lstrip("/")
                if labels.get(LABEL_KIND) == "workstation":
                    shown = labels.get(LABEL_NAME) or shown
                report.containers.append(shown)
            if labels.get(LABEL_KIND) != "workstation":
                continue
            state.forget("workstations", row["Id"])
            if labels.get(LABEL_VOLUME):
                with contextlib.suppress(WorkstationError):
                    _remove_volume(labels[LABEL_VOLUME])
                    report.volumes.append(labels[LABEL_VOLUME])
            if labels.get(LABEL_NETWORK):
                self._remove_egress(labels.get(LABEL_NAME, ""), report)

    def gc(self, everything: bool = False) -> GcReport:
        """Remove what crashed clients left: their scoped containers, orphan volumes, fork snapshots.

        ``everything`` also removes persistent workstations and snapshots (never the base image).
        """
        api = client().api
        report = GcReport()
        with translate("gc"):
            self._reap(api, report, everything)
            self._gc_egress(everything, report)
            in_use = {
                m.get("Name")
                for row in api.containers(all=True)
                for m in row.get("Mounts") or []
                if m.get("Type") == "volume"
            }
            for volume in api.volumes(filters={"label": f"{LABEL_MANAGED}=1"}).get("Volumes") or []:
                creating = owner_alive((volume.get("Labels") or {}).get(LABEL_OWNER, ""))
                if volume["Name"] not in in_use and not creating:
                    # A container may take it between the listing and here: then it stays.
                    with contextlib.suppress(WorkstationError):
                        _remove_volume(volume["Name"])
                        report.volumes.append(volume["Name"])
            disk_gc(api)
            for network in api.networks(filters={"label": f"{LABEL_MANAGED}=1"}):
                attached = api.inspect_network(network["Id"]).get("Containers") or {}
                if not attached:
                    with contextlib.suppress(errors.NotFound):
                        api.remove_network(network["Id"])
                        report.networks.append(network["Name"])
            used_images = {row.get("ImageID") for row in api.containers(all=True)}
            for row in api.images(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}=snapshot"]}
            ):
                labels = row.get("Labels") or {}
                dangling = not row.get("RepoTags") or row.get("RepoTags") == ["<none>:<none>"]
                if row["Id"] in used_images:
                    continue
                if everything or dangling or labels.get(LABEL_EPHEMERAL) == "1":
                    with contextlib.suppress(errors.APIError):
                        api.remove_image(row["Id"], force=True)
                        state.forget("snapshots", row["Id"])
                        report.images.append(labels.get(LABEL_SNAPSHOT) or row["Id"][7:19])
            # Host-side state (diff baselines) of workstations and snapshots that are gone.
            state.prune("workstations", {row["Id"] for row in api.containers(all=True)})
            state.prune("snapshots", {row["Id"] for row in api.images(all=True)})
        return report


def egress_log(name: str) -> builtins.list[EgressEvent]:
    """Every request workstation ``name``'s proxy saw, oldest first (as far as the log reaches)."""
    with translate(f"egress log of {name}"):
        try:
            raw = client().api.logs(f"hybrid-{name}-proxy", stdout=True, stderr=False)
        except errors.NotFound:
            raise WorkstationError(
                f"{name}: its egress proxy is gone (remove and recreate it)"
            ) from None
    return parse_events(raw)


def _workspace_mount(target: str, volume: str) -> DockerMount:
    # The volume's own options repeated: if it vanished before the container is made (a
    # concurrent gc), the engine re-creates it bound to the same capped mount, never a plain one.
    options = client().api.inspect_volume(volume).get("Options") or None
    return DockerMount(target, volume, type="volume", driver_config=DriverConfig("local", options))


def _remove_volume(volume: str) -> None:
    """Remove a workspace volume and then the disk image its mount holds."""
    api = client().api
    with translate("remove workspace volume"):
        try:
            mount = disk.mount_of(api.inspect_volume(volume))
        except errors.NotFound:
            return
        with contextlib.suppress(errors.NotFound):
            api.remove_volume(volume, force=True)
    if mount is not None:
        disk.drop(mount)


def disk_gc(api: Any) -> None:
    """Drop workspace disks no volume binds whose creator died (a client killed mid-create)."""
    bound = {
        str(disk.mount_of(v))
        for v in api.volumes(filters={"label": f"{LABEL_MANAGED}=1"}).get("Volumes") or []
    }
    for mount in disk.orphans(owner_alive):
        if str(mount) not in bound:
            disk.drop(mount)


def _base_env(spec: SandboxSpec) -> dict[str, str]:
    env = {"PATH": BASE_PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}
    if spec.network.mode == "egress":
        from hybrid.workstation.proxy import PORT

        url = f"http://127.0.0.1:{PORT}"
        for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env[key] = url
        env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1"
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
    )


def _egress_count(labels: dict[str, str]) -> int | None:
    if not labels.get(LABEL_NETWORK):
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


def _add_dir(tar: tarfile.TarFile, name: str, owner: tuple[int, int]) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.uid, info.gid = owner
    info.mtime = int(time.time())
    tar.addfile(info)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, owner: tuple[int, int]) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.uid, info.gid = owner
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))
