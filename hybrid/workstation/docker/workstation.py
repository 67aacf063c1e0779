"""One hardened container with a workspace volume (see the package docstring)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import secrets
import shutil
import tarfile
import tempfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from docker import errors
from docker.types import Mount as DockerMount

from hybrid.errors import EngineUnavailable, InvalidInput, PolicyViolation, WorkstationError
from hybrid.policy import SandboxSpec
from hybrid.results import ExecutionResult, Termination, Usage
from hybrid.tiers.container import tier_of
from hybrid.workstation import archive, cgroup, disk, jobuser, state
from hybrid.workstation.base import (
    AttachCommand,
    check_name,
    check_transfer,
    command_argv,
    exec_args,
)
from hybrid.workstation.baseline import Baseline
from hybrid.workstation.docker import backstop, services
from hybrid.workstation.docker.egress import egress_log
from hybrid.workstation.docker.engine import _explain, _stream_client, client, translate
from hybrid.workstation.docker.labels import (
    DEFAULT_USER,
    LABEL_BASE,
    LABEL_DISK,
    LABEL_EPHEMERAL,
    LABEL_KIND,
    LABEL_MANAGED,
    LABEL_NAME,
    LABEL_OWNER,
    LABEL_PERSISTENT,
    LABEL_RUNTIME,
    LABEL_SERVICES,
    LABEL_SNAPSHOT,
    LABEL_SOURCE,
    LABEL_SPEC,
    LABEL_VOLUME,
    SNAPSHOT_REPOSITORY,
    _base_env,
    _info,
    _owner,
    _owner_ids,
)
from hybrid.workstation.docker.slot import Slot, open_slot
from hybrid.workstation.docker.supervision import (
    _WATCHDOG,
    _Chunks,
    _ExecStream,
    _Supervisor,
    watchdog_words,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType
    from typing import Any, Self

    from hybrid.workstation.base import OutputCallback, SnapshotInfo, WorkstationInfo
    from hybrid.workstation.docker.backend import DockerBackend
    from hybrid.workstation.egress import EgressEvent


_Started = tuple[str, _ExecStream, "cgroup.Cgroup | None", "cgroup.Sample | None", float]
"""A command under way: its exec id, its output, the cgroup meter, its first sample, its start."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_REAP_POLLS = 40
"""exec_inspect calls (5 ms apart) an exec that ended its output may take to be reaped."""

_START_ATTEMPTS = 5
"""Starts of one exec while another party keeps stopping the container (a deadline kill can
land again while it restarts under load); nothing ran before each retry."""


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
        # The init's pid as last seen, so an exec finds the cgroup without asking the engine.
        self._pid = int(container.attrs.get("State", {}).get("Pid") or 0) if self._running else 0
        self._closed = False
        self._slot: Slot | None = None
        self._slot_lock = threading.Lock()  # concurrent execs: one of them takes the slot

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
        argv = exec_args(cmd, env, workdir)
        jobuser.refuse_host_ids(*_owner_ids(self.user), f"workstation {self.name}")
        deadline = timeout if timeout is not None else self.spec.budget.wall_seconds
        if workdir is not None and not workdir.startswith("/"):
            workdir = f"{self.spec.workspace}/{workdir}"
        environment = self._environment(env)
        limit = self.spec.budget.output_bytes
        self._ensure_running()
        workdir = workdir or self.spec.workspace
        with self._slot_lock:
            slot, self._slot = self._slot, None
        started = self._start_in_slot(slot, argv, environment, workdir, deadline)
        if started is None:
            started = self._start_exec(argv, environment, workdir, deadline)
        exec_id, stream, meter, before, start = started
        armed = backstop.arm(exec_id, self.id, start + deadline)
        supervisor = _Supervisor(self, stream, start + deadline, meter)
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
            backstop.disarm(armed)
            if slot is not None:
                slot.close()
        wall_ms = (time.time() - start) * 1000
        code = self._exit_code(exec_id)
        after = meter.sample() if meter is not None else None
        if meter is not None:
            meter.close()
        # A container the deadline (or gVisor's OOM) stopped took its cgroup along: the
        # supervisor's last sample is the nearest to the end there is.
        used = cgroup.delta(before, after or supervisor.last_sample)
        termination, exit_code, detail = self._classify(
            code, supervisor, start, deadline, bytes(err)
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
            usage=_usage(wall_ms, used, termination, self.spec.budget.memory),
            detail=detail,
        )

    def _start_exec(
        self, argv: list[str], environment: dict[str, str], workdir: str, deadline: float
    ) -> _Started:
        """Create and start an exec of ``argv`` under the watchdog."""
        api = client().api
        until = time.monotonic() + deadline  # ``deadline``: the command's seconds
        with translate(f"exec in {self.name}"):
            for attempt in range(_START_ATTEMPTS):
                meter = None
                try:
                    exec_id = str(
                        api.exec_create(
                            self.id,
                            [
                                "/bin/sh",
                                "-c",
                                _WATCHDOG,
                                "hybrid-watchdog",
                                *watchdog_words(deadline, time.time(), argv),
                            ],
                            environment=environment,
                            workdir=workdir,
                            user=self.user,
                        )["Id"]
                    )
                    meter = self._cgroup()
                    before = meter.sample() if meter is not None else None
                    start = time.time()
                    return (
                        exec_id,
                        _ExecStream.start(_stream_client(), exec_id),
                        meter,
                        before,
                        start,
                    )
                except errors.APIError as exc:
                    # The container stopped before the command started (another exec's deadline
                    # killed it; the engine then drops the exec records it held): nothing ran,
                    # so start it again and run the command once more.
                    if meter is not None:
                        meter.close()
                    reason = _explain(exc)
                    stopped = "is not running" in reason or "No such exec" in reason
                    last = attempt == _START_ATTEMPTS - 1 or time.monotonic() >= until
                    if last or not stopped:
                        raise
                    self._running = False
                    self._ensure_running()
        raise AssertionError("unreachable")

    def _start_in_slot(
        self,
        slot: Slot | None,
        argv: list[str],
        environment: dict[str, str],
        workdir: str,
        deadline: float,
    ) -> _Started | None:
        """Hand ``argv`` to the exec waiting in ``slot``; None when there is none waiting."""
        if slot is None:
            return None
        # A shell that is gone (a kill, a restart), or a name `export` cannot set: an ordinary
        # exec then.
        if not slot.waiting() or not all(_ENV_NAME.fullmatch(name) for name in environment):
            slot.close()
            return None
        meter = self._cgroup()
        before = meter.sample() if meter is not None else None
        try:
            stream, start = slot.start(argv, environment, workdir, deadline)
        except OSError:
            slot.close()
            if meter is not None:
                meter.close()
            return None
        return slot.exec_id, stream, meter, before, start

    def open_slot(self) -> Slot:
        """Start an exec that waits for a command of this sandbox (slot.py), for ``take_slot``:
        as this sandbox's user, in its workspace, with its environment."""
        return open_slot(self.id, self.user, self._environment(None), self.spec.workspace)

    def take_slot(self, slot: Slot) -> None:
        """Run the next command through ``slot``, an exec already waiting in this sandbox."""
        self.drop_slot()
        with self._slot_lock:
            self._slot = slot

    def drop_slot(self) -> None:
        """Close an unused slot (its shell exits without running anything)."""
        with self._slot_lock:
            slot, self._slot = self._slot, None
        if slot is not None:
            slot.close()

    def _cgroup(self) -> cgroup.Cgroup | None:
        # Found through the container's init, so runc's cgroup and runsc's sandbox cgroup alike;
        # None for a remote engine (no such process here) or a host that hides the counters.
        # The pid last seen is trusted only while its cgroup still names this container (a
        # restart by anyone, or a reused pid, fails that), else the engine is asked.
        with contextlib.suppress(errors.DockerException, KeyError):
            meter = cgroup.Cgroup.of_pid(self._pid, naming=self.id) if self._pid else None
            if meter is None:
                self._pid = int(client().api.inspect_container(self.id)["State"].get("Pid") or 0)
                meter = cgroup.Cgroup.of_pid(self._pid)
            if meter is not None:
                meter.reset_peak()
            return meter
        return None

    def _exit_code(self, exec_id: str) -> int | None:
        """The exec's exit code once the engine has reaped it (None: no record, or not yet).

        Waiting for the reap matters to the metrics too: a process's output closes before the
        kernel charges its last slice of CPU time to the cgroup, so a sample taken at end of
        output could miss a tenth of a second on a loaded host."""
        api = client().api
        with translate(f"exec in {self.name}"):
            for _ in range(_REAP_POLLS):
                try:
                    info = api.exec_inspect(exec_id)
                except errors.NotFound:
                    return None  # the engine drops exec records when the container stops
                if not info.get("Running"):
                    break
                time.sleep(0.005)
        code = info.get("ExitCode")
        return None if code is None else int(code)

    def _classify(
        self, code: int | None, supervisor: _Supervisor, start: float, deadline: float, err: bytes
    ) -> tuple[Termination, int | None, str]:
        api = client().api
        with translate(f"exec in {self.name}"):
            # The watchdog inside may beat the supervisor by a moment on a loaded host.
            overran = code in (None, 137) and time.time() - start >= deadline
            if supervisor.timed_out or overran:
                return (
                    Termination.TIMEOUT,
                    None,
                    f"wall-clock deadline of {deadline:g}s reached; every process was killed "
                    "(raise it: ws exec --timeout SECONDS, or budget.wall_seconds in the policy)",
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
        check_transfer(dest, source)
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
        check_transfer(path, dest)
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
        # The root is read-only, so the workspace is the whole state: base image + workspace,
        # and each service's data as an image of its own.
        builder = None
        service_images: dict[str, str] = {}
        with translate(f"snapshot {self.name}"):
            try:
                if self.spec.services:
                    service_images = services.snapshot_all(self.name, self.spec, name, _owner())
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
                    LABEL_SERVICES: json.dumps(service_images),
                }
                image_id = api.commit(
                    builder, repository=SNAPSHOT_REPOSITORY, tag=name, conf={"Labels": image_labels}
                )["Id"]
                self.baseline().copy_to(Baseline.of("snapshots", image_id))
                # The image carries no values: starting from it copies them from here.
                if self._secret_env:
                    state.save_env(state.directory("snapshots", image_id), self._secret_env)
            except BaseException:
                for image in service_images.values():
                    with contextlib.suppress(errors.DockerException):
                        api.remove_image(image, force=True)
                raise
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
        program = command_argv([program])[0]
        jobuser.refuse_host_ids(*_owner_ids(self.user), f"workstation {self.name}")
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

    def attrs(self) -> dict[str, Any]:
        """The engine's inspect of the container when this object was made (it rebuilds an
        equal object in another process without an engine call: the server's pool does)."""
        attrs: dict[str, Any] = self._container.attrs
        return attrs

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
        self.drop_slot()
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


def _usage(wall_ms: float, used: cgroup.Delta, termination: Termination, cap: int) -> Usage:
    cpu = (
        None
        if used.cpu_user_seconds is None or used.cpu_system_seconds is None
        else (used.cpu_user_seconds + used.cpu_system_seconds) * 1000
    )
    oom, peak = used.oom_events, used.peak_memory_bytes
    if termination is Termination.OUT_OF_MEMORY:
        # gVisor's whole sandbox died, and its counters with it, sometimes before the first
        # poll: an OOM kill of the group still means the group reached its cap.
        oom = max(oom or 0, 1)
        peak = max(peak or 0, cap)
    return Usage(
        wall_ms=wall_ms,
        cpu_ms=cpu,
        **{**used._asdict(), "oom_events": oom, "peak_memory_bytes": peak},
    )


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
