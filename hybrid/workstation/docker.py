"""Docker backend (runc or runsc): hardened workstations over the docker SDK.

Every workstation is one container plus one named volume (its workspace). The root is
read-only, /tmp is a tmpfs, capabilities are all dropped, no-new-privileges is set, pids,
memory and CPU are capped, the network is none and only allow-listed variables are set. The
repository goes in as a copy (put_archive), never a bind mount. All state lives in the
engine's labels, so any process can find a workstation by name.

``network.mode = "egress"`` (runc only: runsc runs with --network=none here) puts the
workstation on an internal network with no route out, next to one proxy container that forwards
only to the allow-list (see proxy.py).

The supervisor deadline kills the whole container (every process, children included) and keeps
the partial output; the workspace volume survives, so the next exec starts it again. Under
gVisor a pids or memory breach kills the whole sandbox: the supervisor notices and reports it.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
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
from docker.types import Mount as DockerMount

from hybrid.errors import (
    EngineUnavailable,
    InvalidInput,
    PolicyViolation,
    WorkstationError,
    WorkstationNotFound,
)
from hybrid.policy import SandboxSpec, admit
from hybrid.results import ExecutionResult, Termination, Usage
from hybrid.workstation.base import (
    GcReport,
    OutputCallback,
    Runtime,
    SnapshotInfo,
    WorkstationInfo,
)

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

SNAPSHOT_REPOSITORY = "hybrid-snapshot"
DEFAULT_USER = "1000:1000"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The baseline for `diff` lives in its own git dir inside the workspace, so the repository's
# own .git (and any uncommitted state it had) is untouched and snapshots carry the baseline.
BASELINE_DIR = ".hybrid/base.git"
_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_GIT = [
    "git",
    "-c", "user.name=hybrid", "-c", "user.email=hybrid@localhost",
    "-c", "core.autocrlf=false", "-c", "core.quotepath=off", "-c", "gc.auto=0",
]  # fmt: skip
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_POLL_SECONDS = 0.5
_RUNSC_PIDS_BASE = 64
_RUNSC_PIDS_PER_TASK = 16

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


def _start_time(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def owner_alive(owner: str) -> bool:
    """Whether the process that labelled something ``owner`` still runs (other hosts: assume yes)."""
    try:
        host, pid, started = owner.split(":")
    except ValueError:
        return False
    if host != socket.gethostname():
        return True
    return _start_time(int(pid)) == started


def runtime_for(spec: SandboxSpec) -> Runtime:
    """runsc for the gvisor tier, runc otherwise."""
    return "runsc" if spec.tier == "gvisor" else "runc"


def check_name(name: str) -> str:
    """Validate a workstation or snapshot name."""
    if not _NAME.match(name):
        raise InvalidInput(
            f"bad name {name!r}: use 1-63 of a-z 0-9 _ . - starting with a letter or digit"
        )
    return name


class DockerWorkstation:
    """One hardened container with a workspace volume; see the module docstring."""

    def __init__(self, container: Any, backend: DockerBackend) -> None:
        labels = container.labels
        self._container = container
        self._backend = backend
        self.id: str = container.id
        self.name: str = labels[LABEL_NAME]
        self.spec: SandboxSpec = SandboxSpec.model_validate_json(labels[LABEL_SPEC])
        self.runtime: str = labels.get(LABEL_RUNTIME, "runc")
        self.tier: str = "gvisor" if self.runtime == "runsc" else "docker"
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
            return str(
                api.exec_create(
                    self.id,
                    argv,
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
            stream = _stream_client().exec_start(exec_id, stream=True, demux=True)
        supervisor = _Supervisor(self, stream, start + deadline)
        out, err = bytearray(), bytearray()
        cut = {"stdout": False, "stderr": False}
        try:
            for chunk_out, chunk_err in stream:
                for kind, chunk, buf in (("stdout", chunk_out, out), ("stderr", chunk_err, err)):
                    if not chunk:
                        continue
                    room = limit - len(buf)
                    if len(chunk) > room:
                        cut[kind] = True
                        chunk = chunk[: max(room, 0)]
                    if chunk:
                        buf.extend(chunk)
                        if on_output is not None:
                            on_output(kind, bytes(chunk))
        except (OSError, ValueError, errors.DockerException):
            pass  # the supervisor closed the stream
        except BaseException:
            # Interrupted (Ctrl-C, a failing callback): stop the command rather than orphan it.
            supervisor.stop()
            self._kill()
            raise
        finally:
            supervisor.stop()
        wall_ms = (time.time() - start) * 1000
        termination, exit_code, detail = self._classify(
            exec_id, supervisor, start, deadline, bytes(err)
        )
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
            if supervisor.timed_out:
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
        """Copy a host file or directory (or bytes, as a file) to ``dest`` inside the workspace."""
        rel = self._relative(dest)
        with tempfile.TemporaryFile() as archive:
            with tarfile.open(fileobj=archive, mode="w") as tar:
                owner = _owner_ids(self.user)
                for i in range(1, len(rel.parts)):
                    _add_dir(tar, str(PurePosixPath(*rel.parts[:i])), owner)
                if isinstance(source, bytes):
                    _add_bytes(tar, str(rel), source, owner)
                else:
                    source = Path(source)
                    if not source.exists():
                        raise InvalidInput(f"{source}: no such file or directory")
                    _add_tree(tar, source, str(rel), owner)
            archive.seek(0)
            self._ensure_running()
            with translate(f"copy into {self.name}"):
                client().api.put_archive(self.id, self.spec.workspace, archive)

    def get(self, path: str, dest: Path | None = None) -> bytes | None:
        """A file's bytes, or with ``dest`` copy a file or directory out to the host directory."""
        inside = path if path.startswith("/") else f"{self.spec.workspace}/{path}"
        with translate(f"copy out of {self.name}"):
            chunks, _stat = client().api.get_archive(self.id, inside)
            with tempfile.TemporaryFile() as archive:
                for chunk in chunks:
                    archive.write(chunk)
                archive.seek(0)
                with tarfile.open(fileobj=archive, mode="r") as tar:
                    if dest is not None:
                        Path(dest).mkdir(parents=True, exist_ok=True)
                        tar.extractall(dest, filter="data")
                        return None
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
        """Copy a repository's working tree (tracked + untracked, not ignored, plus .git) in and record the baseline."""
        repo = Path(repo)
        if not repo.is_dir():
            raise InvalidInput(f"{repo}: not a directory")
        with tempfile.TemporaryFile() as archive:
            with tarfile.open(fileobj=archive, mode="w") as tar:
                owner = _owner_ids(self.user)
                for rel in _repo_files(repo):
                    _add_tree(tar, repo / rel, rel, owner, recurse=False)
            archive.seek(0)
            self._ensure_running()
            with translate(f"copy the repository into {self.name}"):
                client().api.put_archive(self.id, self.spec.workspace, archive)
        self._baseline(commit=True)

    def _baseline(self, commit: bool) -> None:
        git = [*_GIT, f"--git-dir={BASELINE_DIR}", "--work-tree=."]
        script = [
            f"mkdir -p {BASELINE_DIR} && git init -q --bare {BASELINE_DIR}",
            f"echo /.hybrid/ > {BASELINE_DIR}/info/exclude",
            # Keep the baseline out of the repository's own `git status` too.
            "{ test ! -d .git || { mkdir -p .git/info && echo /.hybrid/ >> .git/info/exclude; }; }",
        ]
        if commit:
            script.append(
                _sh(git)
                + " add -A && "
                + _sh(git)
                + " commit -q --allow-empty --no-verify -m baseline"
            )
        result = self.exec(" && ".join(script), timeout=max(60.0, self.spec.budget.wall_seconds))
        if not result.ok:
            raise WorkstationError(
                f"recording the baseline in {self.name} failed: {result.stderr.strip()[-500:]}"
            )

    def diff(self) -> str:
        """Unified diff (git format, binary-safe) of every change since the repository went in."""
        git = _sh([*_GIT, f"--git-dir={BASELINE_DIR}", "--work-tree=."])
        script = (
            f"test -d {BASELINE_DIR} || {{ mkdir -p {BASELINE_DIR} && git init -q --bare {BASELINE_DIR}"
            f" && echo /.hybrid/ > {BASELINE_DIR}/info/exclude; }}; "
            f"{git} add -A && "
            f"if {git} rev-parse -q --verify HEAD >/dev/null; then base=HEAD; else base={_EMPTY_TREE}; fi && "
            # Into a file, not stdout: a patch is not bounded by the output budget.
            f"{git} diff --cached --binary --no-color --no-ext-diff $base > .hybrid/agent.patch"
        )
        result = self.exec(script, timeout=max(60.0, self.spec.budget.wall_seconds))
        if not result.ok:
            raise WorkstationError(
                f"diff in {self.name} failed: {result.detail}: {result.stderr.strip()[-500:]}"
            )
        patch = self.get(f"{self.spec.workspace}/.hybrid/agent.patch") or b""
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
                    LABEL_SPEC: self.spec.model_dump_json(),
                    LABEL_RUNTIME: self.runtime,
                    LABEL_BASE: self.base_image,
                    LABEL_EPHEMERAL: "1" if ephemeral else "0",
                }
                api.commit(
                    builder, repository=SNAPSHOT_REPOSITORY, tag=name, conf={"Labels": image_labels}
                )
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

    def attach_command(self, program: str = "/bin/bash", *, tty: bool = True) -> list[str]:
        """The argv that attaches a person to this workstation (same user, env and limits)."""
        docker_cli = shutil.which("docker")
        if docker_cli is None:
            raise EngineUnavailable(
                "the docker command-line client is needed to attach (apt-get install docker.io)"
            )
        self._ensure_running()
        argv = [docker_cli, "exec", "-it" if tty else "-i", "-u", self.user]
        argv += ["-w", self.spec.workspace]
        for key, value in self._environment(None).items():
            argv += ["-e", f"{key}={value}"]
        return [*argv, self.id, program]

    # -- lifecycle --------------------------------------------------------------------------

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

    def __init__(self, ws: DockerWorkstation, stream: Any, deadline: float) -> None:
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
        with contextlib.suppress(Exception):
            self._stream.close()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


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
    ) -> DockerWorkstation:
        """A new hardened workstation from ``image`` (default the base image) with ``repo`` copied in."""
        from hybrid.workstation.images import BASE_IMAGE

        spec = spec or SandboxSpec(tier="docker")
        runtime = runtime_for(spec)
        tier = "gvisor" if runtime == "runsc" else "docker"
        violations = admit(spec, tier)
        if violations:
            raise PolicyViolation(violations)
        name = check_name(name or f"ws-{secrets.token_hex(4)}")
        image = image or BASE_IMAGE
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
                LABEL_NETWORK: f"hybrid-{name}-net" if spec.network.mode == "egress" else "",
            }
            if api.containers(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_NAME}={name}"]}
            ):
                raise WorkstationError(
                    f"a workstation named {name} exists; pick another name or remove it"
                )
            volume = api.create_volume(
                labels[LABEL_VOLUME],
                labels={LABEL_MANAGED: "1", LABEL_KIND: "workspace", LABEL_NAME: name},
            )["Name"]
            container_id = None
            try:
                if labels[LABEL_NETWORK]:
                    self._egress(labels, spec)
                if (
                    image_labels.get(LABEL_KIND) not in ("base", "snapshot")
                    or spec.workspace != "/workspace"
                ):
                    self._own_workspace(image, volume, spec)
                container_id = api.create_container(
                    image,
                    command=["sleep", "infinity"],
                    name=f"hybrid-{name}",
                    hostname="workstation",
                    user=self.user,
                    working_dir=spec.workspace,
                    environment=_base_env(spec),
                    labels=labels,
                    network_disabled=not labels[LABEL_NETWORK],
                    host_config=self._host_config(spec, runtime, volume, labels[LABEL_NETWORK]),
                )["Id"]
                api.start(container_id)
            except BaseException:
                if container_id is not None:
                    with contextlib.suppress(errors.DockerException):
                        api.remove_container(container_id, force=True)
                with contextlib.suppress(errors.DockerException):
                    api.remove_volume(volume, force=True)
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

    def _egress(self, labels: dict[str, str], spec: SandboxSpec) -> None:
        # An internal network (no route out) shared with one proxy container that also sits on
        # the default bridge and forwards only to the allow-list.
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
        api.create_network(
            labels[LABEL_NETWORK],
            driver="bridge",
            internal=True,
            labels={**owned, LABEL_KIND: "network"},
        )
        source = Path(proxy.__file__).read_text(encoding="utf-8")
        helper = api.create_container(
            BASE_IMAGE,
            command=["python3", "-c", source],
            name=f"hybrid-{name}-proxy",
            user=self.user,
            environment={"HYBRID_ALLOW": json.dumps(spec.network.allow)},
            labels={**owned, LABEL_KIND: "proxy"},
            host_config=api.create_host_config(
                network_mode="bridge",
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                pids_limit=64,
                mem_limit=128 * 1024**2,
                init=True,
            ),
        )["Id"]
        api.connect_container_to_network(helper, labels[LABEL_NETWORK], aliases=["proxy"])
        api.start(helper)

    def _remove_egress(self, name: str) -> None:
        api = client().api
        with contextlib.suppress(errors.DockerException):
            api.remove_container(f"hybrid-{name}-proxy", force=True)
        with contextlib.suppress(errors.DockerException):
            api.remove_network(f"hybrid-{name}-net")

    def _host_config(
        self, spec: SandboxSpec, runtime: str, volume: str, network: str = ""
    ) -> dict[str, Any]:
        budget = spec.budget
        mounts = [DockerMount(spec.workspace, volume, type="volume")]
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
                mounts=[DockerMount(spec.workspace, volume, type="volume")],
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
        return self.create(
            spec, image=info.image, name=name, persistent=persistent, snapshot_of=snapshot
        )

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
            with translate("remove workspace volume"), contextlib.suppress(errors.NotFound):
                api.remove_volume(volume, force=True)
        if image and image.startswith(f"{SNAPSHOT_REPOSITORY}:"):
            self._drop_if_ephemeral(image)

    def _drop_if_ephemeral(self, image: str) -> None:
        api = client().api
        with contextlib.suppress(errors.DockerException):
            labels = api.inspect_image(image)["Config"].get("Labels") or {}
            if labels.get(LABEL_EPHEMERAL) == "1" and not api.containers(
                all=True, filters={"ancestor": image}
            ):
                api.remove_image(image)

    def gc(self, everything: bool = False) -> GcReport:
        """Remove what crashed clients left: their scoped containers, orphan volumes, fork snapshots.

        ``everything`` also removes persistent workstations and snapshots (never the base image).
        """
        api = client().api
        report = GcReport()
        with translate("gc"):
            for row in api.containers(all=True, filters={"label": f"{LABEL_MANAGED}=1"}):
                labels = row.get("Labels") or {}
                abandoned = labels.get(LABEL_PERSISTENT) != "1" and not owner_alive(
                    labels.get(LABEL_OWNER, "")
                )
                if everything or abandoned:
                    with contextlib.suppress(errors.NotFound):
                        api.remove_container(row["Id"], force=True)
                        shown = (row.get("Names") or [row["Id"][:12]])[0].lstrip("/")
                        if labels.get(LABEL_KIND) == "workstation":
                            shown = labels.get(LABEL_NAME) or shown
                        report.containers.append(shown)
            in_use = {
                m.get("Name")
                for row in api.containers(all=True)
                for m in row.get("Mounts") or []
                if m.get("Type") == "volume"
            }
            for volume in api.volumes(filters={"label": f"{LABEL_MANAGED}=1"}).get("Volumes") or []:
                if volume["Name"] not in in_use:
                    with contextlib.suppress(errors.NotFound):
                        api.remove_volume(volume["Name"], force=True)
                        report.volumes.append(volume["Name"])
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
                        report.images.append(labels.get(LABEL_SNAPSHOT) or row["Id"][7:19])
        return report


def _base_env(spec: SandboxSpec) -> dict[str, str]:
    env = {"PATH": BASE_PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}
    if spec.network.mode == "egress":
        from hybrid.workstation.proxy import PORT

        url = f"http://proxy:{PORT}"
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
        tier="gvisor" if runtime == "runsc" else "docker",
        runtime=runtime,
        image=attrs["Config"]["Image"],
        status=attrs["State"]["Status"],
        created=attrs["Created"],
        persistent=labels.get(LABEL_PERSISTENT) == "1",
        snapshot_of=labels.get(LABEL_SNAPSHOT_OF) or None,
    )


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


def _sh(argv: Sequence[str]) -> str:
    return " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)


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


def _add_tree(
    tar: tarfile.TarFile, source: Path, name: str, owner: tuple[int, int], recurse: bool = True
) -> None:
    def own(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not (info.isfile() or info.isdir() or info.issym()):
            return None  # sockets, fifos and devices stay on the host
        info.uid, info.gid = owner
        info.uname = info.gname = ""
        return info

    tar.add(source, arcname=name, recursive=recurse, filter=own)


def _repo_files(repo: Path) -> list[str]:
    """Relative paths to copy: git's tracked + untracked-not-ignored files and .git, or everything."""
    if (repo / ".git").exists():
        try:
            listed = subprocess.run(
                [
                    "git",
                    "-C",
                    str(repo),
                    "ls-files",
                    "-z",
                    "--cached",
                    "--others",
                    "--exclude-standard",
                ],
                capture_output=True,
                check=True,
            ).stdout.decode("utf-8", errors="surrogateescape")
        except (OSError, subprocess.CalledProcessError):
            listed = None
        if listed is not None:
            files = sorted(
                {
                    p
                    for p in listed.split("\0")
                    if p and ((repo / p).is_symlink() or (repo / p).exists())
                }
            )
            dirs = sorted({str(PurePosixPath(p).parent) for p in files} - {"."})
            parents = sorted(
                {
                    str(a)
                    for d in dirs
                    for a in [PurePosixPath(d), *PurePosixPath(d).parents]
                    if str(a) != "."
                }
            )
            git_tree = (
                [str(p.relative_to(repo)) for p in sorted((repo / ".git").rglob("*"))]
                if (repo / ".git").is_dir()
                else []
            )
            return [*parents, ".git", *git_tree, *files]
    return [str(p.relative_to(repo)) for p in sorted(repo.rglob("*"))]
