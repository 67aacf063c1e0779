"""Workstations in QEMU microVMs (tier ``microvm``): one VM per workstation.

The workspace is a size-capped ext4 image loop-mounted on the host (``hybrid.workstation.disk``)
and shared into the guest over 9p, so ``put``/``get``/``diff`` work on host files as the local
backend does (with symlinks the guest planted refused), while commands run only inside the VM,
through the guest agent (``guest/agent.c``), as ``GUEST_UID`` without capabilities. Read-only
mounts from the spec are further 9p shares. Nothing else of the host is in the guest: its root
is the base image, read-only; it has no network device.

Each workstation is a directory under the state directory (``microvm/NAME``): ``meta.json``,
``baseline.git``, QEMU's sockets, pid and logs. A VM starts from a template snapshot of its
shape (``vm.template``), so a new workstation is ready in about a second here.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import os
import secrets
import shutil
import signal
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hybrid import owner
from hybrid.errors import InvalidInput, PolicyViolation, WorkstationError
from hybrid.paths import state_dir
from hybrid.policy import SandboxSpec, admit
from hybrid.results import ExecutionResult, Termination, Usage
from hybrid.workstation import archive, disk, homes, jobuser
from hybrid.workstation.base import (
    AttachCommand,
    GcReport,
    OutputCallback,
    WorkstationInfo,
    check_transfer,
    exec_args,
)
from hybrid.workstation.local import LocalWorkstation
from hybrid.workstation.microvm import build, vm

TIER = "microvm"
GUEST_UID, GUEST_GID = jobuser.JOB_UID, jobuser.JOB_GID
"""The unprivileged user every command runs as inside the guest, and the owner of the workspace on
the host: ids no host account has (hybrid.workstation.jobuser), so no host process of an account
can write into a running VM's workspace through its own permissions."""
GUEST_OVERHEAD = 192 * 1024**2
"""Guest RAM beyond the job's memory budget: kernel, agent, page cache."""
HOST_GRACE = 15.0
"""Seconds past a deadline the host waits for the guest's answer before it kills the VM."""


def _root() -> Path:
    return state_dir("microvm")


def shape_of(spec: SandboxSpec) -> vm.Shape:
    """The VM a spec needs: RAM for the budget plus the guest's own, vCPUs, one share per mount."""
    mib = math.ceil((spec.budget.memory + GUEST_OVERHEAD) / (128 * 1024**2)) * 128
    cpus = max(1, min(math.ceil(spec.budget.cpus), os.cpu_count() or 1))
    return vm.Shape(memory_mib=mib, cpus=cpus, shares=1 + len(spec.mounts))


class MicrovmWorkstation(LocalWorkstation):
    """A microVM with a 9p workspace; file operations are the local backend's, on the host side."""

    def __init__(self, home: Path, machine: vm.Machine | None = None) -> None:
        super().__init__(home)
        self.tier = TIER
        self.workspace_dir = Path(self._meta["mount"])
        self._machine = machine
        self._lock = threading.Lock()

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
        """Run ``cmd`` in the guest; the deadline kills its whole cgroup there."""
        argv = exec_args(cmd, env, workdir)
        jobuser.check()  # a host account made since create() would own the shared workspace
        self._live()
        refused = sorted(set(env or {}) - set(self.spec.env.allow))
        if refused:
            raise PolicyViolation(
                [f"env: {name} is not on the allow-list (env.allow)" for name in refused]
            )
        deadline = timeout if timeout is not None else self.spec.budget.wall_seconds
        cwd = workdir or self.spec.workspace
        if not cwd.startswith("/"):
            cwd = f"{self.spec.workspace}/{cwd}"
        environment = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.spec.workspace,
            "LANG": "C.UTF-8",
        }
        environment.update(self.spec.env.resolve())
        environment.update(env or {})
        limit = self.spec.budget.output_bytes
        machine = self._connected()
        output = vm.Output(limit, on_output)
        request: dict[str, Any] = {
            "op": "exec",
            "argv": argv,
            "env": environment,
            "cwd": cwd,
            "timeout": deadline,
            "limit": limit,
            "uid": GUEST_UID,
            "time": time.time(),
        }
        start = time.monotonic()
        end: dict[str, Any] = {}
        stream = machine.stream(request, start + deadline + HOST_GRACE)
        try:
            for message in stream:
                if "stream" in message:
                    output.add(message["stream"], message.get("data"))
                if message.get("end"):
                    end = vm.check_end(message)
            if machine.failure:
                raise vm.GuestFailure(f"{machine.failure}; the microVM is no longer trusted")
        except vm.GuestFailure:
            # A guest that broke the protocol is not asked for anything more: the VM is ended.
            stream.close()
            self._kill_machine()
            raise
        except BaseException:
            # Interrupted or a raising on_output: stop the job in the guest, then re-raise.
            stream.close()
            with contextlib.suppress(Exception):
                machine.call({"op": "kill_all"}, timeout=5)
            raise
        wall_ms = (time.monotonic() - start) * 1000
        termination, exit_code, detail = self._classify(end, deadline)
        termination, detail = disk.classify(
            str(self.workspace_dir),
            self.spec.budget.disk_for(TIER),
            termination,
            detail,
            bytes(output.kept["stderr"]),
        )
        cut = output.cut["stdout"] or output.cut["stderr"] or bool(end.get("cut"))
        if termination in (Termination.OK, Termination.NONZERO_EXIT) and cut:
            termination, detail = Termination.OUTPUT_LIMIT, f"output over {limit} bytes was cut"
        return ExecutionResult(
            tier=TIER,
            termination=termination,
            exit_code=exit_code,
            stdout=output.kept["stdout"].decode("utf-8", errors="replace"),
            stderr=output.kept["stderr"].decode("utf-8", errors="replace"),
            stdout_truncated=output.cut["stdout"] or "stdout" in (end.get("cut") or ()),
            stderr_truncated=output.cut["stderr"] or "stderr" in (end.get("cut") or ()),
            usage=Usage(wall_ms=wall_ms),
            detail=detail,
        )

    def _classify(
        self, end: dict[str, Any], deadline: float
    ) -> tuple[Termination, int | None, str]:
        if end.get("lost") or end.get("gone"):
            # The guest stopped answering: the VM is ended so nothing runs on unsupervised.
            self._kill_machine()
            return (
                Termination.TIMEOUT,
                None,
                f"the microVM did not answer by the {deadline:g} s deadline; it was stopped",
            )
        if "error" in end:
            return Termination.ERROR, None, f"microVM agent: {end['error']}"[:300]
        if end.get("timed_out"):
            return Termination.TIMEOUT, None, f"killed at the {deadline:g} s deadline"
        if end.get("oom"):
            return (
                Termination.OUT_OF_MEMORY,
                None,
                f"over the memory budget of {self.spec.budget.memory} bytes",
            )
        if end.get("signal"):
            return Termination.ERROR, None, f"killed by signal {end['signal']}"
        code = end.get("code")
        if code == 0:
            return Termination.OK, 0, ""
        return Termination.NONZERO_EXIT, code, f"exit status {code}"

    # -- files: the local backend's, with the guest's symlinks refused ------------------------

    def put(self, source: Path | bytes, dest: str) -> None:
        """Copy a host file or directory (or bytes) into the workspace, owned by the guest user."""
        check_transfer(dest, source)
        target = self._host(dest)
        if target.is_symlink():
            target.unlink()  # a link the guest planted is replaced, never written through
        super().put(source, dest)
        _own(target)

    def copy_repo(self, repo: Path) -> None:
        """Copy a repository's working tree in (as every backend selects it) and record it.

        Every symlink is carried as it is, absolute ones included: they resolve inside the
        guest, and the host side never follows one (``_host``)."""
        if not Path(repo).is_dir():
            raise InvalidInput(f"{repo}: not a directory")
        recorder = self._baseline().recorder()
        owner = (GUEST_UID, GUEST_GID)
        with tempfile.TemporaryFile() as buffer:
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                entries = archive.walk(Path(repo), archive.repo_selection(Path(repo)))
                for entry in archive.pack(tar, entries, "", owner, recorder):
                    info = tarfile.TarInfo(entry.path)
                    info.type, info.linkname = tarfile.SYMTYPE, entry.target
                    info.uid, info.gid = owner
                    tar.addfile(info)
            buffer.seek(0)
            # Our own archive of the host's files into a fresh workspace the guest has not
            # touched yet (it boots after the copy): nothing there to write through.
            with tarfile.open(fileobj=buffer, mode="r:") as tar:
                tar.extractall(self.workspace_dir, filter="fully_trusted", numeric_owner=True)
        recorder.commit()

    def _host(self, path: str) -> Path:
        found = super()._host(path)
        real = os.path.realpath(self.workspace_dir)
        parent = os.path.realpath(found.parent)
        if parent != real and not parent.startswith(real + os.sep):
            raise InvalidInput(f"{path}: lies under a symlink that leaves the workspace")
        return found

    # -- state ------------------------------------------------------------------------------

    def info(self) -> WorkstationInfo:
        running = (self._machine is not None and self._machine.alive()) or _pid_of(
            self._home
        ) is not None
        artifacts = build.built()
        return WorkstationInfo(
            name=self.name,
            id=self.id,
            tier=TIER,
            runtime="qemu-" + vm.accel()[0],
            image=artifacts.rootfs.name if artifacts else "",
            status="running" if running and self._home.is_dir() else "exited",
            created=self._created,
            persistent=self.persistent,
        )

    def attach_command(self, program: str = "/bin/bash", *, tty: bool = True) -> AttachCommand:
        """No terminal reaches the guest yet: ``program`` runs through the agent, without a tty."""
        return AttachCommand(
            [sys.executable, "-m", "hybrid", "ws", "exec", self.name, "--", program], {}
        )

    def stop(self) -> None:
        """Kill every command running in the guest; the VM and the files stay."""
        if self._machine is not None and self._machine.alive():
            with contextlib.suppress(WorkstationError, TimeoutError):
                self._machine.call({"op": "kill_all"}, timeout=10)

    def remove(self) -> None:
        """Stop the VM and delete the workstation, its workspace disk and state."""
        self._kill_machine()
        _remove_home(self._home)
        self._closed = True

    def close(self) -> None:
        if self._closed:
            return
        if self.persistent:
            if self._machine is not None:
                self._machine.detach()
            self._closed = True
        else:
            self.remove()

    def __repr__(self) -> str:
        return f"<MicrovmWorkstation {self.name}>"

    # -- helpers ----------------------------------------------------------------------------

    def _connected(self) -> vm.Machine:
        with self._lock:
            if self._machine is None:
                pid = _pid_of(self._home)
                if pid is None:
                    raise WorkstationError(f"the microVM of {self.name} is not running")
                self._machine = vm.Machine.attach(self._home, pid)
                self._machine.connect(timeout=10)
            return self._machine

    def _kill_machine(self) -> None:
        if self._machine is not None:
            self._machine.close()
        else:
            _kill_pid(self._home)


def _own(path: Path) -> None:
    """Hand a host-side copy to the guest user (9p passes ownership through)."""
    with contextlib.suppress(FileNotFoundError):
        os.lchown(path, GUEST_UID, GUEST_GID)
        if path.is_dir() and not path.is_symlink():
            for parent, dirs, files in os.walk(path):
                for name in dirs + files:
                    with contextlib.suppress(FileNotFoundError):
                        os.lchown(os.path.join(parent, name), GUEST_UID, GUEST_GID)


def _pid_of(home: Path) -> int | None:
    """QEMU's pid if the one this workstation started still runs."""
    try:
        pid = int((home / "qemu.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if str(home).encode() in cmdline else None


def _kill_pid(home: Path) -> None:
    pid = _pid_of(home)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        for _ in range(200):
            if _pid_of(home) is None:
                break
            time.sleep(0.01)


def _remove_home(home: Path) -> None:
    _kill_pid(home)
    with contextlib.suppress(OSError, ValueError, KeyError):
        disk.drop(Path(homes.read_meta(home)["mount"]))
    shutil.rmtree(home, ignore_errors=True)


class MicrovmBackend:
    """Makes, finds and cleans up microVM workstations."""

    def create(
        self,
        spec: SandboxSpec | None = None,
        *,
        image: str | None = None,
        repo: Path | None = None,
        name: str | None = None,
        persistent: bool = False,
        lifetime: float | None = None,
    ) -> MicrovmWorkstation:
        """A new microVM workstation with ``repo`` copied in (``image``: the base image only)."""
        jobuser.check()
        spec = (spec or SandboxSpec()).model_copy(update={"tier": TIER})
        violations = admit(spec, TIER)
        if violations:
            raise PolicyViolation(violations)
        if image is not None:
            raise InvalidInput(
                "the microvm tier boots the root filesystem built from the base image "
                "(hybrid image microvm); it takes no --image"
            )
        artifacts = build.built()
        if artifacts is None:
            raise WorkstationError(
                "the microVM artifacts are not built for this version of hybrid: run `hybrid image microvm` (~2 min, once)"
            )
        name = name or f"vm-{secrets.token_hex(4)}"
        home = homes.make(_root(), name)
        try:
            mount = disk.create(
                f"microvm-{name}", spec.budget.disk_for(TIER), owner.mark(), owner.mark_alive
            )
            os.chown(mount, GUEST_UID, GUEST_GID)
            meta = {
                "name": name,
                "id": f"microvm-{secrets.token_hex(8)}",
                "spec": spec.model_dump(mode="json"),
                "persistent": persistent,
                "created": datetime.now(UTC).isoformat(),
                "owner": owner.mark(),
                "mount": str(mount),
            }
            homes.write_meta(home, meta)
            made = MicrovmWorkstation(home)
            if repo is not None:
                made.copy_repo(repo)
            made._machine = _boot(artifacts, spec, home, mount, tied=not persistent)
        except BaseException:
            _remove_home(home)
            raise
        return made

    def open(self, name: str) -> MicrovmWorkstation:
        return MicrovmWorkstation(homes.find(_root(), name))

    def list(self) -> builtins.list[WorkstationInfo]:
        return [MicrovmWorkstation(home).info() for home in homes.every(_root())]

    def reap(self) -> GcReport:
        """Remove non-persistent workstations whose creating process is gone."""
        return self.gc()

    def gc(self, everything: bool = False) -> GcReport:
        report = GcReport()
        for home, meta in homes.collectable(_root(), everything):
            with contextlib.suppress(OSError, ValueError, KeyError):
                _remove_home(home)
                report.containers.append(meta["name"])
        return report


def _boot(
    artifacts: build.Artifacts, spec: SandboxSpec, home: Path, mount: Path, *, tied: bool
) -> vm.Machine:
    """Start the VM from its shape's template, mount the shares, set the limits."""
    shape = shape_of(spec)
    shares = [vm.Share("s0", mount, spec.workspace, False)]
    shares += [
        vm.Share(f"s{i}", Path(m.source), m.target, m.mode == "ro")
        for i, m in enumerate(spec.mounts, start=1)
    ]
    snapshot = vm.template(artifacts, shape)
    machine = vm.Machine(artifacts, shape, home, shares, incoming=snapshot, tied=tied)
    try:
        machine.connect()
        machine.call(
            {
                "op": "setup",
                "memory": spec.budget.memory,
                "pids": spec.budget.pids,
                "uid": GUEST_UID,
                "shares": [{"tag": s.tag, "path": s.guest, "ro": s.read_only} for s in shares],
                "time": time.time(),
            }
        )
    except BaseException:
        machine.close()
        raise
    return machine
