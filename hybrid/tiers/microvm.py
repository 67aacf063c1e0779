"""Tier ``microvm``: one-shot QEMU ``-M microvm`` guests with their own kernel.

The strongest boundary here: the guest has its own Linux kernel, a read-only root, no network
device and only the workspace (and read-only mounts) shared over 9p. KVM when the host's KVM
can boot a stock kernel, TCG otherwise (``hybrid.workstation.microvm.vm.accel`` says which and
why). The artifacts come from ``hybrid image microvm`` (Debian kernel, the guest agent
compiled here, base image).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from typing import TYPE_CHECKING

from hybrid.tiers.base import (
    OutputCallback,
    Probe,
    TierLimits,
    host_disk,
    host_memory,
    run_in,
    with_job_user,
)

if TYPE_CHECKING:
    from hybrid.policy import SandboxSpec
    from hybrid.results import ExecutionResult
    from hybrid.router import Job
    from hybrid.workstation.microvm import MicrovmBackend

BUILD = "hybrid image microvm"
EGRESS_REFUSAL = (
    "network: the microvm tier has no network device (egress through the proxy is not built "
    'for it yet); use mode = "none", or the docker tier for egress'
)


class MicrovmTier:
    """Commands and snippets in a fresh microVM started from a warm snapshot."""

    name = "microvm"
    minimums = {"memory": (32 * 1024**2, "the guest's python3 and shell need it")}
    egress_refusal: str | None = EGRESS_REFUSAL
    streams = True

    def limits(self) -> TierLimits:
        cpus = float(os.cpu_count() or 1)
        return TierLimits(
            24 * 3600, host_memory() // 2, None, 32768, cpus, 64 * 1024**2, False, host_disk()
        )

    def misfit(self, job: Job) -> str | None:
        if job.needs_network or job.spec.network.mode == "egress":
            return "no network device in a microVM"
        if job.check is not None or job.module() is not None:
            return "built-in checks and WASI modules run in the wasm tier"
        if job.needs_services:
            return "no services in a microVM workstation yet"
        if not job.command and job.snippet() is None:
            return "nothing to run (give a command or a Python snippet)"
        return None

    def reasons(self, job: Job) -> list[str]:
        return ["its own guest kernel (QEMU microVM), no network device"]

    def probe(self, deep: bool = False) -> Probe:
        from hybrid.workstation.microvm import build, vm

        if shutil.which(vm.QEMU) is None:
            return Probe(
                False, "QEMU is not installed", "apt-get install -y qemu-system-x86 gcc libc6-dev"
            )
        accelerator, why = vm.accel()
        artifacts = build.built()
        if artifacts is None:
            return Probe(
                False,
                f"QEMU found ({why}); the guest kernel, initramfs and root filesystem are not built for this version",
                f"{BUILD} (Debian kernel via apt, root filesystem from the base image, ~2 min)",
            )
        detail = f"QEMU -M microvm, {accelerator}: {why}; kernel {artifacts.kernel_package}"
        if deep:
            failure = _smoke()
            if failure:
                return Probe(
                    False,
                    f"{detail}; {failure}",
                    f"rebuild: {BUILD} --force; see the VM's console.log",
                )
            detail += "; a microVM ran"
        return with_job_user(detail)

    def backend(self) -> MicrovmBackend:
        from hybrid.workstation.microvm import MicrovmBackend

        return MicrovmBackend()

    def run(
        self, job: Job, spec: SandboxSpec, on_output: OutputCallback | None = None
    ) -> ExecutionResult:
        _reap_once()
        with self.backend().create(spec, repo=job.repo) as ws:
            return run_in(ws, job, on_output)


def _smoke() -> str:
    from hybrid.policy import SandboxSpec
    from hybrid.workstation.microvm import MicrovmBackend

    try:
        with MicrovmBackend().create(SandboxSpec(tier="microvm")) as ws:
            result = ws.exec("true", timeout=60)
            return "" if result.ok else f"`true` ended {result.termination.value}: {result.detail}"
    except Exception as exc:  # a probe never raises: the failure is its answer
        return f"a microVM failed: {str(exc).splitlines()[0][:200]}"


_reaped_in: int | None = None


def _reap_once() -> None:
    # What killed clients left (VMs, workspace disks) goes once per process, on a thread.
    global _reaped_in
    if _reaped_in == os.getpid():
        return
    _reaped_in = os.getpid()
    from hybrid.workstation.microvm import MicrovmBackend

    def reap() -> None:
        with contextlib.suppress(Exception):
            MicrovmBackend().reap()

    threading.Thread(target=reap, name="hybrid-microvm-reap", daemon=True).start()


MICROVM = MicrovmTier()
