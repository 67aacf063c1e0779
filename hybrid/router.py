"""Send each job to the cheapest tier that can honour it, and say why.

A ``Job`` declares what it is (a built-in check, a WASI module, a Python snippet or a command)
and what it needs (processes, network, services, repository-wide files, a toolchain, input
size, untrusted code). ``route()`` walks the tiers cheapest first (wasm, python-wasm, docker,
gvisor) and returns the first that honours every trait and is available on this host, with a
reason for every tier it passed over. ``run()`` routes and executes, returning the foundation's
ExecutionResult from whichever tier ran it.

The wasm tiers are imported lazily, so the router works on builds (and hosts) without them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hybrid.errors import EngineUnavailable, InvalidInput, PolicyViolation
from hybrid.policy import SandboxSpec, admit
from hybrid.results import ExecutionResult, Termination

TIER_ORDER = ("wasm", "python-wasm", "docker", "gvisor")
CHECKS = ("csv", "json", "grep", "redact", "scope")
# Beyond these sizes in-process WebAssembly stops being the cheap choice (wasm32 memory, copies).
WASM_INPUT_LIMIT = 256 * 1024**2
PYTHON_WASM_INPUT_LIMIT = 64 * 1024**2
TierChoice = Literal["auto", "wasm", "python-wasm", "docker", "gvisor"]


class Job(BaseModel):
    """One unit of work and the traits the router needs to place it."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] = Field(
        default_factory=list, description="An argv to run (a .wasm path first runs that module)."
    )
    python: str | None = Field(None, description="A Python snippet to run.")
    tests: str | None = Field(
        None, description="Asserts or test_* functions run after the snippet."
    )
    check: Literal["csv", "json", "grep", "redact", "scope"] | None = Field(
        None, description="A built-in check to run."
    )
    check_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the check (paths, options)."
    )
    stdin: str | None = Field(None, description="Text fed to a WASI module's stdin.")
    repo: Path | None = Field(
        None, description="A repository copied into the sandbox (implies repo_wide)."
    )
    image: str | None = Field(
        None, description="Container image for the process tiers (default: the base image)."
    )
    needs_processes: bool = Field(
        False, description="Spawns processes (shells, compilers, test runners)."
    )
    needs_network: bool = Field(False, description="Opens network connections.")
    needs_services: bool = Field(
        False, description="Needs running services (a database, a daemon)."
    )
    repo_wide: bool = Field(False, description="Reads or writes files across a repository.")
    toolchain: str | None = Field(
        None, description="A language toolchain it needs (python, node, gcc, ...)."
    )
    input_bytes: int = Field(0, ge=0, description="Total size of the inputs.")
    untrusted: bool = Field(
        False, description="Runs hostile or unreviewed code: needs the stronger boundary."
    )
    spec: SandboxSpec = Field(
        default_factory=SandboxSpec, description="Budgets, mounts, env, network."
    )

    def snippet(self) -> str | None:
        """The Python source this job runs, from ``python`` or a ``python3 -c CODE`` command."""
        if self.python is not None:
            return self.python
        if (
            len(self.command) == 3
            and Path(self.command[0]).name in ("python", "python3")
            and self.command[1] == "-c"
        ):
            return self.command[2]
        return None

    def module(self) -> str | None:
        """The WASI module this job runs, when its command starts with a .wasm file."""
        if self.command and self.command[0].endswith((".wasm", ".wat")):
            return self.command[0]
        return None


class Route(BaseModel):
    """The router's decision, explained."""

    tier: str = Field(description="The tier chosen.")
    reasons: list[str] = Field(description="Why this tier honours the job.")
    rejected: dict[str, str] = Field(
        default_factory=dict, description="Every cheaper (or refused) tier and why not."
    )


Availability = Mapping[str, tuple[bool, str]]
_availability_cache: dict[str, tuple[bool, str]] | None = None


def availability(refresh: bool = False) -> dict[str, tuple[bool, str]]:
    """tier -> (available, reason) on this host, from ``hybrid doctor``'s probes (cached per process)."""
    global _availability_cache
    if _availability_cache is None or refresh:
        from hybrid.workstation.doctor import probe

        _availability_cache = {
            s.tier: (s.available, s.detail if s.available else f"{s.detail}; fix: {s.fix}")
            for s in probe()
        }
    return dict(_availability_cache)


def _fit(job: Job, tier: str) -> str | None:
    """Why ``tier`` cannot honour ``job`` (None when it can), ignoring host availability."""
    container_only = [
        name
        for flag, name in (
            (job.needs_processes, "processes"),
            (job.needs_services, "services"),
            (job.repo_wide or job.repo is not None, "repository-wide files"),
            (
                job.toolchain not in (None, "python")
                if tier == "python-wasm"
                else job.toolchain is not None,
                f"the {job.toolchain} toolchain",
            ),
        )
        if flag
    ]
    if job.needs_network or job.spec.network.mode == "egress":
        if tier in ("wasm", "python-wasm"):
            return "no network in WebAssembly"
        if job.spec.network.mode != "egress" or not job.spec.network.allow:
            return 'network needs network.mode = "egress" with an allow-list (--allow HOST)'
    if tier == "wasm":
        if job.check is None and job.module() is None:
            return "runs only built-in checks and WASI modules"
        if container_only:
            return f"no {', '.join(container_only)} in WebAssembly"
        if job.input_bytes > WASM_INPUT_LIMIT:
            return f"inputs over {WASM_INPUT_LIMIT // 1024**2} MiB"
        return None
    if tier == "python-wasm":
        if job.snippet() is None:
            return "runs only Python snippets"
        if container_only:
            return f"no {', '.join(container_only)} in Python-in-WASM"
        if job.input_bytes > PYTHON_WASM_INPUT_LIMIT:
            return f"inputs over {PYTHON_WASM_INPUT_LIMIT // 1024**2} MiB"
        return None
    if job.check is not None or job.module() is not None:
        return "built-in checks and WASI modules run in the wasm tier"
    if not job.command and job.snippet() is None:
        return "nothing to run (give a command or a Python snippet)"
    if tier == "docker" and job.untrusted:
        return "untrusted code needs the stronger gVisor boundary"
    return None


def route(job: Job, tier: TierChoice = "auto", available: Availability | None = None) -> Route:
    """Pick the cheapest tier that honours ``job`` and is available; PolicyViolation if none."""
    wanted = tier if tier != "auto" else job.spec.tier
    host = dict(available) if available is not None else availability()
    rejected: dict[str, str] = {}
    candidates = TIER_ORDER if wanted == "auto" else (wanted,)
    for name in candidates:
        misfit = _fit(job, name)
        if misfit is None:
            violations = admit(job.spec.model_copy(update={"tier": name}), name)
            if violations:
                misfit = "; ".join(violations)
        if misfit is not None:
            rejected[name] = misfit
            continue
        ok, why = host.get(name, (False, "not probed"))
        if not ok:
            rejected[name] = f"not available here: {why}"
            continue
        return Route(tier=name, reasons=_reasons(job, name, wanted), rejected=rejected)
    if wanted != "auto":
        why = rejected[wanted]
        if why.startswith("not available here"):
            raise EngineUnavailable(f"tier {wanted} is {why}")
        raise PolicyViolation([f"tier {wanted} cannot run this job: {why}"])
    reasons = set(rejected.values())
    if len(reasons) == 1:
        summary = reasons.pop()
    else:
        summary = "; ".join(f"{t}: {why}" for t, why in rejected.items())
    raise PolicyViolation([f"no tier can run this job ({summary})"])


def _reasons(job: Job, tier: str, wanted: str) -> list[str]:
    reasons = (
        ["requested explicitly"] if wanted != "auto" else ["cheapest tier that honours every trait"]
    )
    if tier == "wasm":
        reasons.append(
            f"built-in check {job.check}" if job.check else f"WASI module {job.module()}"
        )
    elif tier == "python-wasm":
        reasons.append(
            "a Python snippet with no processes, network or repository: fresh CPython-in-WASM instance"
        )
    else:
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
        if tier == "gvisor":
            reasons.append(
                "untrusted code: gVisor intercepts every syscall"
                if job.untrusted
                else "gVisor boundary"
            )
    return reasons


def run(
    job: Job,
    tier: TierChoice = "auto",
    *,
    available: Availability | None = None,
    on_output: Callable[[str, bytes], None] | None = None,
) -> ExecutionResult:
    """Route ``job`` and run it there; every tier returns the same ExecutionResult."""
    chosen = route(job, tier, available)
    spec = job.spec.model_copy(update={"tier": chosen.tier})
    if chosen.tier == "wasm":
        return _run_wasm(job, spec)
    if chosen.tier == "python-wasm":
        runner = importlib.import_module("hybrid.wasm.python")
        source = job.snippet()
        assert source is not None
        result: ExecutionResult = runner.run_python(source, job.tests, spec=spec)
        return result
    return _run_container(job, spec, on_output)


def _run_wasm(job: Job, spec: SandboxSpec) -> ExecutionResult:
    if job.check is not None:
        checks = importlib.import_module("hybrid.checks")
        function = getattr(checks, f"check_{job.check}", None) or getattr(checks, job.check)
        report = function(**job.check_args, budget=spec.budget)
        return ExecutionResult(
            tier="wasm",
            termination=(
                report.termination
                if report.termination is not Termination.OK
                else (Termination.OK if report.ok else Termination.NONZERO_EXIT)
            ),
            exit_code=None if report.termination is not Termination.OK else (0 if report.ok else 1),
            stdout=json.dumps(report.model_dump(mode="json", exclude={"usage"}), indent=2) + "\n",
            usage=report.usage,
            detail=report.detail or ("" if report.ok else f"check {job.check} failed"),
        )
    from hybrid.wasm import run as wasm_run

    module = job.module()
    assert module is not None
    return wasm_run(
        Path(module), job.command[1:], stdin=job.stdin, spec=spec, program=Path(module).name
    )


ONE_SHOT_SETUP_SECONDS = 30.0
"""How long a one-shot container may take from its start to its command's start (copying a
repository takes longer: its baseline commit gets its own allowance). Past that plus the wall
budget the engine ends the container by itself, even if the client was killed."""

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


def _run_container(
    job: Job, spec: SandboxSpec, on_output: Callable[[str, bytes], None] | None
) -> ExecutionResult:
    from hybrid.workstation import backend

    _reap_once()
    snippet = job.snippet()
    setup = ONE_SHOT_SETUP_SECONDS + (max(60.0, spec.budget.wall_seconds) if job.repo else 0.0)
    lifetime = spec.budget.wall_seconds + setup
    with backend().create(spec, image=job.image, repo=job.repo, lifetime=lifetime) as ws:
        if snippet is not None and not job.command:
            source = snippet + ("\n\n" + job.tests if job.tests else "") + "\n"
            ws.put(source.encode(), ".hybrid-job.py")
            return ws.exec(["python3", ".hybrid-job.py"], on_output=on_output)
        if not job.command:
            raise InvalidInput("nothing to run (give a command or a Python snippet)")
        return ws.exec(job.command, on_output=on_output)
