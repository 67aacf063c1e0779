"""Tier ``python-wasm``: Python snippets in a fresh CPython-in-WASM instance."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from hybrid.tiers.base import OutputCallback, Probe, TierLimits, needs_beyond, network_misfit
from hybrid.tiers.wasm import WASM_MINIMUMS, wasm_limits

if TYPE_CHECKING:
    from hybrid.policy import SandboxSpec
    from hybrid.results import ExecutionResult
    from hybrid.router import Job

PYTHON_WASM_INPUT_LIMIT = 64 * 1024**2
"""Beyond this input size a CPython-in-WASM instance stops being the cheap choice."""


class PythonWasmTier:
    """Python snippets (and their tests) with no processes, network or repository."""

    name = "python-wasm"
    minimums = WASM_MINIMUMS
    egress_refusal = None
    streams = False

    def limits(self) -> TierLimits:
        return wasm_limits()

    def misfit(self, job: Job) -> str | None:
        network = network_misfit(job, False, "no network in WebAssembly")
        if network:
            return network
        if job.snippet() is None:
            return "runs only Python snippets"
        beyond = needs_beyond(job, python_toolchain=True)
        if beyond:
            return f"no {', '.join(beyond)} in Python-in-WASM"
        if job.input_bytes > PYTHON_WASM_INPUT_LIMIT:
            return f"inputs over {PYTHON_WASM_INPUT_LIMIT // 1024**2} MiB"
        return None

    def reasons(self, job: Job) -> list[str]:
        return [
            "a Python snippet with no processes, network or repository: fresh CPython-in-WASM instance"
        ]

    def probe(self, deep: bool = False) -> Probe:
        try:
            module = importlib.import_module("hybrid.wasm.python")
        except ImportError as exc:
            return Probe(
                False,
                f"hybrid.wasm.python is not in this build ({exc})",
                "update hybrid to a build that ships Python-in-WASM",
            )
        if importlib.util.find_spec("componentize_py") is None:
            return Probe(
                False,
                "componentize-py is not installed (it builds the CPython guest)",
                "pip install componentize-py==0.25.1",
            )
        ready = bool(getattr(module, "is_ready", lambda: False)())
        return Probe(
            True,
            "CPython guest built" if ready else "CPython guest builds on first use (~20 s, once)",
        )

    def run(
        self, job: Job, spec: SandboxSpec, on_output: OutputCallback | None = None
    ) -> ExecutionResult:
        runner = importlib.import_module("hybrid.wasm.python")
        source = job.snippet()
        assert source is not None
        result: ExecutionResult = runner.run_python(source, job.tests, spec=spec)
        return result

    def backend(self) -> None:
        return None  # runs in process: no workstations
