"""Tier ``bwrap``: a bubblewrap namespace sandbox with cgroup limits and a seccomp filter.

Daemonless and about ten times cheaper to start than a container; it shares the host kernel
like runc, so untrusted code still goes to gVisor. No network at all. See
hybrid.workstation.bwrap for the mechanism.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from hybrid.tiers.base import (
    OutputCallback,
    Probe,
    TierLimits,
    host_disk,
    host_memory,
    network_misfit,
    run_in,
    with_job_user,
)

if TYPE_CHECKING:
    from hybrid.policy import SandboxSpec
    from hybrid.results import ExecutionResult
    from hybrid.router import Job
    from hybrid.workstation.bwrap import BwrapBackend

INSTALL = "apt-get install -y bubblewrap"


class BwrapTier:
    """Processes in private namespaces over a read-only toolchain root; no daemon."""

    name = "bwrap"
    # The wrapper, bwrap and its pid-namespace init are in the cgroup before the command runs.
    minimums = {
        "memory": (8 * 1024**2, "bwrap and a shell do not start in less"),
        "pids": (3, "bwrap, its namespace init and one command"),
    }
    egress_refusal = None
    streams = True

    def limits(self) -> TierLimits:
        cpus = float(os.cpu_count() or 1)
        return TierLimits(
            24 * 3600, host_memory(), None, 32768, cpus, 64 * 1024**2, False, host_disk()
        )

    def misfit(self, job: Job) -> str | None:
        network = network_misfit(job, False, "no network in the bwrap sandbox (docker has egress)")
        if network:
            return network
        if job.check is not None or job.module() is not None:
            return "built-in checks and WASI modules run in the wasm tier"
        if not job.command and job.snippet() is None:
            return "nothing to run (give a command or a Python snippet)"
        if job.untrusted:
            return (
                "untrusted code needs the stronger gVisor boundary (bwrap shares the host kernel)"
            )
        if job.needs_services:
            return "services need a long-lived container (docker)"
        return None

    def reasons(self, job: Job) -> list[str]:
        needs = [
            name
            for flag, name in (
                (job.needs_processes, "processes"),
                (job.repo_wide or job.repo is not None, "repository-wide files"),
                (job.toolchain is not None, f"toolchain {job.toolchain}"),
            )
            if flag
        ]
        first = "needs " + ", ".join(needs) if needs else "a process command"
        return [first, "no network: daemonless namespace sandbox, cheapest process tier"]

    def probe(self, deep: bool = False) -> Probe:
        from hybrid.workstation.bwrap import cgroups, rootfs, seccomp

        binary = shutil.which("bwrap")
        if binary is None:
            return Probe(False, "bubblewrap (bwrap) is not installed", INSTALL)
        missing = [tool for tool in ("setpriv",) if os.geteuid() == 0 and not shutil.which(tool)]
        if missing:
            return Probe(False, f"{', '.join(missing)} is missing", "apt-get install -y util-linux")
        if not seccomp.supported():
            return Probe(False, "no seccomp syscall table for this CPU", "use the docker tier")
        if os.geteuid() != 0 and not _userns_allowed():
            return Probe(
                False,
                "unprivileged user namespaces are disabled",
                "sysctl -w kernel.unprivileged_userns_clone=1 (or user.max_user_namespaces > 0), or run as root",
            )
        why = cgroups.problem()
        if why:
            return Probe(False, f"no cgroup for limits: {why}", "run as root, or delegate a cgroup")
        if os.geteuid() != 0:
            return Probe(
                False,
                "a size-capped workspace is a tmpfs mounted on the host: needs root",
                "run as root",
            )
        root = rootfs.find()
        layout = cgroups.layout()
        detail = f"{_version(binary)}, cgroup v{layout.version}, seccomp filter, root: "
        detail += (
            f"{root.image} (exported)"
            if root is not None
            else "base image exported on first use (host /usr without the engine)"
        )
        if deep:
            failure = _smoke()
            if failure:
                return Probe(False, f"{detail}; {failure}", "check bwrap's message above")
            detail += "; a sandbox ran"
        return with_job_user(detail)

    def backend(self) -> BwrapBackend:
        from hybrid.workstation.bwrap import BwrapBackend

        return BwrapBackend()

    def run(
        self, job: Job, spec: SandboxSpec, on_output: OutputCallback | None = None
    ) -> ExecutionResult:
        backend = self.backend()
        _reap_once(backend)
        with backend.create(spec, image=job.image, repo=job.repo) as ws:
            return run_in(ws, job, on_output)


_reaped_in: int | None = None


def _reap_once(backend: BwrapBackend) -> None:
    # What killed clients left (cgroups, workspaces) goes at the first run of a process: a few
    # stat calls, so on the run's path rather than on a thread that could die with a short CLI.
    global _reaped_in
    if _reaped_in == os.getpid():
        return
    _reaped_in = os.getpid()
    backend.reap()


def _userns_allowed() -> bool:
    for path, bad in (
        ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
        ("/proc/sys/user/max_user_namespaces", "0"),
    ):
        try:
            if Path(path).read_text().strip() == bad:
                return False
        except OSError:
            continue
    return True


def _version(binary: str) -> str:
    try:
        return subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "bubblewrap"


def _smoke() -> str:
    from hybrid.errors import HybridError
    from hybrid.policy import Budget, SandboxSpec
    from hybrid.workstation.bwrap import BwrapBackend

    try:
        spec = SandboxSpec(tier="bwrap", budget=Budget(wall_seconds=20, memory="64M", disk="16M"))
        with BwrapBackend().create(spec) as ws:
            result = ws.exec(["true"])
        return "" if result.ok else f"a sandbox ran `true` and it ended {result.termination.value}"
    except HybridError as exc:
        return f"a sandbox failed: {exc.message}"
    except OSError as exc:
        return f"a sandbox failed: {exc}"


BWRAP = BwrapTier()
