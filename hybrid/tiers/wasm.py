"""Tier ``wasm``: built-in checks and WASI modules in an in-process wasmtime store."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from hybrid.tiers.base import OutputCallback, Probe, TierLimits, needs_beyond, network_misfit

if TYPE_CHECKING:
    from hybrid.policy import SandboxSpec
    from hybrid.results import ExecutionResult
    from hybrid.router import Job

WASM_INPUT_LIMIT = 256 * 1024**2
"""Beyond this input size in-process WebAssembly stops being the cheap choice (wasm32, copies)."""
WASM_DISK_MAX = 1024**3
"""The largest WASM scratch cap: the scratch is a RAM-backed tmpfs where mounting is possible."""
WASM_MINIMUMS = {"memory": (64 * 1024, "one WebAssembly page")}


def wasm_limits() -> TierLimits:
    """Limits shared by both WebAssembly tiers (wasm32 caps memory at 4 GiB)."""
    return TierLimits(600, 4 * 1024**3, 10**13, None, 1.0, 64 * 1024**2, False, WASM_DISK_MAX)


class WasmTier:
    """Built-in checks and WASI modules: fuel, store limits, no processes, no network."""

    name = "wasm"
    minimums = WASM_MINIMUMS
    egress_refusal = None
    streams = False

    def limits(self) -> TierLimits:
        return wasm_limits()

    def misfit(self, job: Job) -> str | None:
        network = network_misfit(job, False, "no network in WebAssembly")
        if network:
            return network
        if job.check is None and job.module() is None:
            return "runs only built-in checks and WASI modules"
        beyond = needs_beyond(job)
        if beyond:
            return f"no {', '.join(beyond)} in WebAssembly"
        if job.input_bytes > WASM_INPUT_LIMIT:
            return f"inputs over {WASM_INPUT_LIMIT // 1024**2} MiB"
        return None

    def reasons(self, job: Job) -> list[str]:
        return [f"built-in check {job.check}" if job.check else f"WASI module {job.module()}"]

    def probe(self, deep: bool = False) -> Probe:
        try:
            import wasmtime

            from hybrid.wasm import engine as wasm_engine

            wasm_engine.engine()
        except Exception as exc:  # any failure to load the runtime means the tier is out
            return Probe(False, f"wasmtime does not load: {exc}", "pip install 'wasmtime>=50,<51'")
        version = getattr(wasmtime, "__version__", "") or _dist_version("wasmtime")
        detail = f"wasmtime {version}, in process"
        try:
            importlib.import_module("hybrid.checks")
            detail += "; built-in checks (csv, json, grep, redact, scope)"
        except ImportError:
            detail += "; built-in checks not in this build"
        return Probe(True, detail)

    def run(
        self, job: Job, spec: SandboxSpec, on_output: OutputCallback | None = None
    ) -> ExecutionResult:
        from hybrid.results import ExecutionResult, Termination

        if job.check is not None:
            checks = importlib.import_module("hybrid.checks")
            function = getattr(checks, f"check_{job.check}", None) or getattr(checks, job.check)
            report = function(**job.check_args, budget=spec.budget)
            failed = report.termination is not Termination.OK
            return ExecutionResult(
                tier=self.name,
                termination=(
                    report.termination
                    if failed
                    else (Termination.OK if report.ok else Termination.NONZERO_EXIT)
                ),
                exit_code=None if failed else (0 if report.ok else 1),
                stdout=json.dumps(report.model_dump(mode="json", exclude={"usage"}), indent=2)
                + "\n",
                usage=report.usage,
                detail=report.detail or ("" if report.ok else f"check {job.check} failed"),
            )
        from hybrid.wasm import run as wasm_run

        module = job.module()
        assert module is not None
        return wasm_run(
            Path(module), job.command[1:], stdin=job.stdin, spec=spec, program=Path(module).name
        )

    def backend(self) -> None:
        return None  # runs in process: no workstations


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "?"
