"""Send each job to the cheapest tier that can honour it, and say why.

A ``Job`` declares what it is (a built-in check, a WASI module, a Python snippet or a command)
and what it needs (processes, network, services, repository-wide files, a toolchain, input
size, untrusted code). ``route()`` walks the registered tiers cheapest first (``hybrid.tiers``:
wasm, python-wasm, docker, gvisor) and returns the first that honours every trait and is
available on this host, with a reason for every tier it passed over. ``run()`` routes and executes, returning the foundation's
ExecutionResult from whichever tier ran it.

Each tier (``hybrid.tiers.base.Tier``) says why a job does not fit it, why it does, and runs
it; the runtimes are imported lazily, so the router works on builds (and hosts) without them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hybrid import tiers
from hybrid.errors import EngineUnavailable, PolicyViolation
from hybrid.policy import SandboxSpec, admit, check_text
from hybrid.results import ExecutionResult
from hybrid.tiers.base import probe_session

log = logging.getLogger(__name__)

TierChoice = str
"""``auto`` or a registered tier's name (hybrid.tiers.names())."""


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
_probed: dict[str, tuple[bool, str]] = {}


def _probe(name: str) -> tuple[bool, str]:
    """(available, reason) of tier ``name`` on this host, probed once per process."""
    if name not in _probed:
        found = tiers.get(name).probe()
        _probed[name] = (
            found.available,
            found.detail if found.available else f"{found.detail}; fix: {found.fix}",
        )
    return _probed[name]


def availability(refresh: bool = False) -> dict[str, tuple[bool, str]]:
    """tier -> (available, reason) on this host, from ``hybrid doctor``'s probes (cached per process)."""
    if refresh:
        _probed.clear()
    with probe_session():
        return {name: _probe(name) for name in tiers.names()}


def _fit(job: Job, tier: str) -> str | None:
    """Why ``tier`` cannot honour ``job`` (None when it can), ignoring host availability."""
    return tiers.get(tier).misfit(job)


def route(job: Job, tier: TierChoice = "auto", available: Availability | None = None) -> Route:
    """Pick the cheapest tier that honours ``job`` and is available.

    Raises EngineUnavailable when the tiers that would honour it are not available on this
    host, PolicyViolation when no tier honours it at all.
    """
    wanted = tier if tier != "auto" else job.spec.tier
    rejected: dict[str, str] = {}
    candidates = tiers.names() if wanted == "auto" else (wanted,)
    with probe_session():  # only the tiers that fit are probed, cheapest first
        return _route(job, wanted, candidates, available, rejected)


def _route(
    job: Job,
    wanted: str,
    candidates: tuple[str, ...],
    available: Availability | None,
    rejected: dict[str, str],
) -> Route:
    for name in candidates:
        misfit = _fit(job, name)
        if misfit is None:
            violations = admit(job.spec.model_copy(update={"tier": name}), name)
            if violations:
                misfit = "; ".join(violations)
        if misfit is not None:
            rejected[name] = misfit
            continue
        ok, why = _probe(name) if available is None else available.get(name, (False, "not probed"))
        if not ok:
            rejected[name] = f"not available here: {why}"
            continue
        return Route(tier=name, reasons=_reasons(job, name, wanted), rejected=rejected)
    if wanted != "auto":
        why = rejected[wanted]
        if why.startswith("not available here"):
            raise EngineUnavailable(f"tier {wanted} is {why}")
        raise PolicyViolation([f"tier {wanted} cannot run this job: {why}"])
    missing = {t: why for t, why in rejected.items() if why.startswith("not available here")}
    if missing:
        # The job fits a tier this host lacks: that is a missing engine, not a policy refusal.
        listed = "; ".join(
            f"{t}: {why.removeprefix('not available here: ')}" for t, why in missing.items()
        )
        raise EngineUnavailable(f"no tier that can run this job is available here ({listed})")
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
    return reasons + tiers.get(tier).reasons(job)


def run(
    job: Job,
    tier: TierChoice = "auto",
    *,
    available: Availability | None = None,
    on_output: Callable[[str, bytes], None] | None = None,
) -> ExecutionResult:
    """Route ``job`` and run it there; every tier returns the same ExecutionResult."""
    # Before any tier is chosen or sandbox made: what reaches a command line holds no NUL.
    for i, arg in enumerate(job.command):
        check_text(arg, f"command argument {i}", data=True)
    if job.image is not None:
        check_text(job.image, "image")
    chosen = route(job, tier, available)
    log.info("routed to %s: %s", chosen.tier, "; ".join(chosen.reasons))
    for name, why in chosen.rejected.items():
        log.debug("not %s: %s", name, why)
    spec = job.spec.model_copy(update={"tier": chosen.tier})
    result = tiers.get(chosen.tier).run(job, spec, on_output)
    log.info(
        "%s run ended %s in %.1f ms", chosen.tier, result.termination.value, result.usage.wall_ms
    )
    return result
