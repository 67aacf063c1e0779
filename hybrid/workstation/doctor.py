"""Which execution tiers this host can run, and for each one it cannot, why and how to enable it.

Every probe asks the real thing (import the runtime, ping the engine, list its runtimes, look
up the base image; ``deep`` also starts a container per runtime) and never raises: a missing
piece is a row with ``available=False``, a reason and a fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import threading
from typing import Any

from pydantic import BaseModel, Field

ENGINE_SCRIPT = "scripts/engine.sh"


class TierStatus(BaseModel):
    """One tier on this host."""

    tier: str
    available: bool
    detail: str = Field(
        description="What was found (versions, images), or why the tier cannot run."
    )
    fix: str = Field("", description="How to enable it, when it is not available.")


def probe(deep: bool = False) -> list[TierStatus]:
    """Probe every tier: wasm, python-wasm, docker (runc), gvisor (runsc)."""
    engine = _engine()
    return [_wasm(), _python_wasm(), *_containers(engine, deep)]


def _wasm() -> TierStatus:
    try:
        import wasmtime

        from hybrid.wasm import engine as wasm_engine

        wasm_engine.engine()
    except Exception as exc:  # any failure to load the runtime means the tier is out
        return TierStatus(
            tier="wasm",
            available=False,
            detail=f"wasmtime does not load: {exc}",
            fix="pip install 'wasmtime>=50,<51'",
        )
    version = getattr(wasmtime, "__version__", "") or _dist_version("wasmtime")
    detail = f"wasmtime {version}, in process"
    try:
        importlib.import_module("hybrid.checks")
        detail += "; built-in checks (csv, json, grep, redact, scope)"
    except ImportError:
        detail += "; built-in checks not in this build"
    return TierStatus(tier="wasm", available=True, detail=detail)


def _python_wasm() -> TierStatus:
    try:
        module = importlib.import_module("hybrid.wasm.python")
    except ImportError as exc:
        return TierStatus(
            tier="python-wasm",
            available=False,
            detail=f"hybrid.wasm.python is not in this build ({exc})",
            fix="update hybrid to a build that ships Python-in-WASM",
        )
    if importlib.util.find_spec("componentize_py") is None:
        return TierStatus(
            tier="python-wasm",
            available=False,
            detail="componentize-py is not installed (it builds the CPython guest)",
            fix="pip install componentize-py==0.25.1",
        )
    ready = bool(getattr(module, "is_ready", lambda: False)())
    detail = "CPython guest built" if ready else "CPython guest builds on first use (~20 s, once)"
    return TierStatus(tier="python-wasm", available=True, detail=detail)


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
            fix = f"install and start it: {ENGINE_SCRIPT} (or apt-get install -y docker.io, then start dockerd)"
        else:
            fix = f"start it: {ENGINE_SCRIPT} (starts dockerd with runsc registered)"
        return {"error": f"no Docker engine at {where} ({first})", "fix": fix}


def _containers(engine: dict[str, Any], deep: bool) -> list[TierStatus]:
    if "error" in engine:
        docker_row = TierStatus(
            tier="docker", available=False, detail=engine["error"], fix=engine["fix"]
        )
        gvisor_fix = engine["fix"]
        if shutil.which("runsc") is None:
            gvisor_fix += "; install gVisor: apt-get install -y runsc"
        gvisor_row = TierStatus(
            tier="gvisor", available=False, detail=engine["error"], fix=gvisor_fix
        )
        return [docker_row, gvisor_row]

    from hybrid.workstation.images import BASE_IMAGE

    made, info = engine["client"], engine["info"]
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    version = info.get("ServerVersion", "?")
    image_missing = not _has_image(made, BASE_IMAGE)
    rows = []
    for tier, runtime in (("docker", "runc"), ("gvisor", "runsc")):
        detail = f"Docker {version}, runtime {runtime}, cgroup {info.get('CgroupVersion', '?')}"
        if runtime not in runtimes:
            if shutil.which("runsc") is None:
                fix = f"apt-get install -y runsc, then restart dockerd with the config {ENGINE_SCRIPT} writes"
            else:
                fix = (
                    "register runsc in the daemon config "
                    '("runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}}) '
                    f"and restart dockerd ({ENGINE_SCRIPT} writes that config)"
                )
            rows.append(
                TierStatus(
                    tier=tier,
                    available=False,
                    detail=f"the engine has no {runtime} runtime (has: {', '.join(runtimes)})",
                    fix=fix,
                )
            )
            continue
        if image_missing:
            rows.append(
                TierStatus(
                    tier=tier,
                    available=False,
                    detail=f"{detail}; the base image {BASE_IMAGE} is missing",
                    fix="hybrid image bootstrap (debootstrap from this machine's apt mirror, ~1 min), or pass --image",
                )
            )
            continue
        if deep:
            failure = _smoke(made, runtime, BASE_IMAGE)
            if failure:
                rows.append(
                    TierStatus(
                        tier=tier,
                        available=False,
                        detail=f"{detail}; {failure}",
                        fix=_smoke_fix(runtime),
                    )
                )
                continue
            detail += "; a hardened container ran"
        rows.append(TierStatus(tier=tier, available=True, detail=detail))
    return rows


def _has_image(made: Any, tag: str) -> bool:
    try:
        made.images.get(tag)
        return True
    except Exception:  # ImageNotFound or an engine error: either way not usable
        return False


def _owner() -> str:
    from hybrid.workstation.docker import _owner as owner

    return owner()


def _smoke(made: Any, runtime: str, image: str) -> str:
    """Run `true` hardened under ``runtime`` with a hard timeout (runsc can hang on a bad platform)."""
    outcome: dict[str, str] = {}

    def attempt() -> None:
        container = None
        try:
            container = made.containers.create(
                image,
                ["true"],
                runtime=runtime,
                network_mode="none",
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
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


def _smoke_fix(runtime: str) -> str:
    if runtime == "runsc":
        return "check the runsc flags in the daemon config (--network=none, --platform=ptrace) and the dockerd log"
    return "check the dockerd log (cgroup driver cgroupfs on cgroup v1 hosts)"


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "?"
