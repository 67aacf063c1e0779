"""Tiers ``docker`` (runc) and ``gvisor`` (runsc): one-shot hardened Docker workstations.

Both are the same backend under a different OCI runtime, so one class serves both; the
runtime <-> tier map lives here and nowhere else (``runtime_of``, ``tier_of``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from hybrid.tiers.base import (
    OutputCallback,
    Probe,
    TierLimits,
    host_disk,
    host_memory,
    network_misfit,
    run_in,
    shared,
    with_job_user,
)

if TYPE_CHECKING:
    from hybrid.policy import SandboxSpec
    from hybrid.results import ExecutionResult
    from hybrid.router import Job
    from hybrid.workstation.docker import DockerBackend

ENGINE_SETUP = "hybrid engine install"
"""What brings the engine up (hybrid.workstation.install: the packaged engine.sh)."""
ONE_SHOT_SETUP_SECONDS = 30.0
"""How long a one-shot container may take from its start to its command's start (copying a
repository takes longer: its baseline commit gets its own allowance). Past that plus the wall
budget the engine ends the container by itself, even if the client was killed."""


class ContainerTier:
    """A hardened container under one OCI runtime of the local Docker engine."""

    egress_refusal: str | None
    services_refusal: str | None
    streams = True

    def __init__(
        self,
        name: str,
        runtime: str,
        *,
        minimums: Mapping[str, tuple[float, str]],
        boundary: tuple[str, str] | None = None,
        untrusted_refusal: str | None = None,
        egress_refusal: str | None = None,
        services_refusal: str | None = None,
        install: tuple[str, str] | None = None,
        smoke_fix: str,
    ) -> None:
        self.name = name
        self.runtime = runtime
        self.minimums = minimums
        self.egress_refusal = egress_refusal
        self.services_refusal = services_refusal
        self._boundary = boundary  # (reason when untrusted, reason otherwise)
        self._untrusted_refusal = untrusted_refusal
        self._install = install  # (binary, how to install it) when the runtime is a package
        self._smoke_fix = smoke_fix

    def limits(self) -> TierLimits:
        cpus = float(os.cpu_count() or 1)
        return TierLimits(
            24 * 3600, host_memory(), None, 32768, cpus, 64 * 1024**2, True, host_disk()
        )

    def misfit(self, job: Job) -> str | None:
        network = network_misfit(job, True)
        if network:
            return network
        if job.check is not None or job.module() is not None:
            return "built-in checks and WASI modules run in the wasm tier"
        if not job.command and job.snippet() is None:
            return "nothing to run (give a command or a Python snippet)"
        if job.untrusted and self._untrusted_refusal:
            return self._untrusted_refusal
        return None

    def reasons(self, job: Job) -> list[str]:
        reasons = []
        needs = [
            name
            for flag, name in (
                (job.needs_processes, "processes"),
                (job.needs_services, "services"),
                (job.repo_wide or job.repo is not None, "repository-wide files"),
                (job.toolchain is not None, f"toolchain {job.toolchain}"),
            )
            if flag
        ]
        if job.spec.network.mode == "egress":
            needs.append("egress to " + ", ".join(job.spec.network.allow))
        if needs:
            reasons.append("needs " + ", ".join(needs))
        elif job.snippet() is None:
            reasons.append("a process command")
        if self._boundary:
            reasons.append(self._boundary[0] if job.untrusted else self._boundary[1])
        return reasons

    def probe(self, deep: bool = False) -> Probe:
        engine = shared("docker-engine", _engine)
        if "error" in engine:
            fix = engine["fix"]
            if self._install and shutil.which(self._install[0]) is None:
                fix += f"; {self._install[1]}"
            return Probe(False, engine["error"], fix)

        from hybrid.workstation.images import BASE_IMAGE

        made, info = engine["client"], engine["info"]
        runtimes = sorted((info.get("Runtimes") or {}).keys())
        version = info.get("ServerVersion", "?")
        detail = (
            f"Docker {version}, runtime {self.runtime}, cgroup {info.get('CgroupVersion', '?')}"
        )
        if self.runtime not in runtimes:
            if shutil.which("runsc") is None:
                fix = f"apt-get install -y runsc, then restart dockerd with the config {ENGINE_SETUP} writes"
            else:
                fix = (
                    "register runsc in the daemon config "
                    '("runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}}) '
                    f"and restart dockerd ({ENGINE_SETUP} writes that config)"
                )
            return Probe(
                False, f"the engine has no {self.runtime} runtime (has: {', '.join(runtimes)})", fix
            )
        if not shared("base-image", lambda: _has_image(made, BASE_IMAGE)):
            return Probe(
                False,
                f"{detail}; the base image {BASE_IMAGE} is missing",
                "hybrid image bootstrap (debootstrap from this machine's apt mirror, ~1 min), or pass --image",
            )
        from hybrid.errors import EngineUnavailable
        from hybrid.workstation.docker import seccomp

        try:
            args = ((info.get("Runtimes") or {}).get(self.runtime) or {}).get("runtimeArgs")
            detail += f"; {seccomp.describe(self.runtime, args)}"
        except EngineUnavailable as exc:
            return Probe(False, f"{detail}; {exc}", ENGINE_SETUP)
        if deep:
            failure = _smoke(made, self.runtime, BASE_IMAGE)
            if failure:
                return Probe(False, f"{detail}; {failure}", self._smoke_fix)
            detail += "; a hardened container ran"
        return with_job_user(detail)

    def run(
        self, job: Job, spec: SandboxSpec, on_output: OutputCallback | None = None
    ) -> ExecutionResult:
        _reap_once()
        setup = ONE_SHOT_SETUP_SECONDS + (max(60.0, spec.budget.wall_seconds) if job.repo else 0.0)
        lifetime = spec.budget.wall_seconds + setup
        with _sandbox(self.name, job, spec, lifetime) as ws:
            return run_in(ws, job, on_output)

    def backend(self) -> DockerBackend:
        from hybrid.workstation.docker import DockerBackend

        return DockerBackend()  # one backend for every runtime: create() picks it from the spec


@contextlib.contextmanager
def _sandbox(tier: str, job: Job, spec: SandboxSpec, lifetime: float) -> Iterator[Any]:
    """A one-shot sandbox for ``job``: from the resident server's warm pool when it has one
    ready (hybrid/server/pool.py), else created here; either way used once and destroyed."""
    from hybrid.server import pool
    from hybrid.workstation import backend

    with pool.sandbox(tier, job.image, spec) as pooled:
        if pooled is None:
            with backend().create(spec, image=job.image, repo=job.repo, lifetime=lifetime) as ws:
                yield ws
            return
        if job.repo is not None:
            from hybrid.policy import check_input_path

            # The same rule create() applies to a repository: it is an input the user named.
            check_input_path(job.repo, "repository")
            pooled.copy_repo(job.repo)
        yield pooled


def container_tiers() -> list[ContainerTier]:
    """The registered tiers that are Docker runtimes, in registry order."""
    from hybrid import tiers

    return [t for t in tiers.all_tiers() if isinstance(t, ContainerTier)]


def runtime_of(tier: str) -> str:
    """The OCI runtime of a container tier (runc for any other tier, e.g. auto)."""
    return next((t.runtime for t in container_tiers() if t.name == tier), "runc")


def tier_of(runtime: str) -> str:
    """The container tier that runs ``runtime`` (docker for an unknown one)."""
    return next((t.name for t in container_tiers() if t.runtime == runtime), "docker")


_reaped_in: int | None = None


def _reap_once() -> None:
    # What killed clients left behind goes once per process, on a thread: never on a run's path.
    global _reaped_in
    if _reaped_in == os.getpid():
        return
    _reaped_in = os.getpid()
    from hybrid.workstation import backend

    def reap() -> None:
        with contextlib.suppress(Exception):  # best effort: `hybrid ws gc` reports failures
            backend().reap()

    threading.Thread(target=reap, name="hybrid-reap", daemon=True).start()


# -- probes -----------------------------------------------------------------------------------


def _engine() -> dict[str, Any]:
    """Ping the engine with a short timeout; returns info, or the reason it is unreachable."""
    try:
        import docker
    except ImportError:
        return {
            "error": "the docker Python SDK is not installed",
            "fix": "pip install 'docker>=7.1'",
        }
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        made = docker.from_env(timeout=10)
        info = made.info()
        return {"client": made, "info": info}
    except Exception as exc:  # the SDK raises several families here; all mean "no engine"
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        if shutil.which("dockerd") is None:
            fix = f"install and start it: {ENGINE_SETUP} (or apt-get install -y docker.io, then start dockerd)"
        else:
            fix = f"start it: {ENGINE_SETUP} (starts dockerd with runsc registered)"
        return {"error": f"no Docker engine at {where} ({first})", "fix": fix}


def _has_image(made: Any, tag: str) -> bool:
    try:
        made.images.get(tag)
        return True
    except Exception:  # ImageNotFound or an engine error: either way not usable
        return False


def _owner() -> str:
    from hybrid.workstation.docker.labels import _owner as owner

    return owner()


def _smoke(made: Any, runtime: str, image: str) -> str:
    """Run `true` hardened under ``runtime`` with a hard timeout (runsc can hang on a bad platform)."""
    from hybrid.workstation import jobuser
    from hybrid.workstation.docker import seccomp

    outcome: dict[str, str] = {}

    def attempt() -> None:
        container = None
        try:
            container = made.containers.create(
                image,
                ["true"],
                runtime=runtime,
                user=jobuser.USER,
                network_mode="none",
                read_only=True,
                cap_drop=["ALL"],
                security_opt=seccomp.security_opt(),
                labels={"hybrid.managed": "1", "hybrid.kind": "doctor", "hybrid.owner": _owner()},
            )
            container.start()
            status = container.wait(timeout=30)
            if status.get("StatusCode") != 0:
                outcome["error"] = f"a {runtime} container exited {status.get('StatusCode')}"
        except Exception as exc:
            outcome["error"] = f"a {runtime} container failed: {str(exc).splitlines()[0][:160]}"
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except Exception:
                    outcome.setdefault("cleanup", "left a container; hybrid ws gc removes it")

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(45)
    if worker.is_alive():
        return f"a {runtime} container did not finish in 45 s"
    return outcome.get("error", "")


DOCKER = ContainerTier(
    "docker",
    "runc",
    minimums={
        "memory": (6 * 1024**2, "the engine refuses less"),
        "pids": (2, "the workstation's init and one command"),
    },
    untrusted_refusal="untrusted code needs the stronger gVisor boundary",
    smoke_fix="check the dockerd log (cgroup driver cgroupfs on cgroup v1 hosts)",
)
GVISOR = ContainerTier(
    "gvisor",
    "runsc",
    # Measured on this host type (Docker 20.10, runsc with ptrace): runsc's sandbox is killed
    # while starting under 16 MiB or 32 pids (its own threads count against the limit).
    minimums={
        "memory": (16 * 1024**2, "runsc's sandbox does not start in less"),
        "pids": (32, "runsc's own threads count against the limit"),
    },
    boundary=("untrusted code: gVisor intercepts every syscall", "gVisor boundary"),
    egress_refusal=(
        "network: gVisor here runs with --network=none (the host cannot give it a "
        'network namespace); use the docker tier for egress, or mode = "none"'
    ),
    # Measured: with --network=none the sandbox has its own loopback (a service's port in the
    # shared namespace refuses), and without --host-uds it cannot connect to a unix socket in a
    # shared volume (EPERM). No path to a service container is left.
    services_refusal=(
        "services: gVisor here runs with --network=none and no host unix sockets, so nothing "
        "outside the sandbox is reachable from it; use the docker tier for services"
    ),
    install=("runsc", "install gVisor: apt-get install -y runsc"),
    smoke_fix="check the runsc flags in the daemon config (--network=none, --platform=ptrace) and the dockerd log",
)
