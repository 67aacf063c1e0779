"""Run a Python snippet (and its tests) in a fresh CPython-in-WebAssembly instance.

Every run instantiates the cached compiled component into a new Store, so no state survives
between runs. The snippet sees only its input files (read-only, in its working directory), has
no sockets, no host environment, an empty stdin, and the spec's fuel, memory and wall-clock caps.
Its stdout/stderr go through bounded pipes; the harness inside the guest returns the per-test
outcomes and a traceback restricted to the user's own files.

This module runs one snippet and turns what happened into its result; the parts it uses are
modules of their own: ``instances`` (Linker, stores, the prepared next instance), ``workers``
(pinned guest threads), ``staging`` (scratch root, input files) and ``tests_cache``.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import wasmtime

from hybrid.errors import PolicyViolation
from hybrid.policy import Budget, SandboxSpec, admit
from hybrid.results import ExecutionResult, Termination, TestOutcome, finish_result
from hybrid.wasm import engine as _engine
from hybrid.wasm.pipes import OutputPipe
from hybrid.wasm.python import guest, instances, staging
from hybrid.wasm.python.staging import InputFiles
from hybrid.wasm.python.tests_cache import TESTS
from hybrid.wasm.python.workers import WORKERS
from hybrid.wasm.runtime import classify_error, classify_trap, preopen_mounts

TIER = "python-wasm"

DEFAULT_SPEC = SandboxSpec(
    tier="python-wasm",
    budget=Budget(
        wall_seconds=10.0, memory=256 * 1024**2, fuel=20_000_000_000, output_bytes=1024**2
    ),
)
"""10 s, 256 MiB, 2e10 fuel (~2 s of pure-Python loops, ~7M simple iterations), 1 MiB per stream."""

TRACEBACK_CHARS = 8000
"""A traceback longer than this keeps its head and its tail (the innermost frames)."""

BACKSTOP_SECONDS = 0.5
"""Grace past the deadline before the caller stops waiting for a guest stuck in a host call."""

IN_WORKER = False
"""True in an isolation worker process: runs happen here; elsewhere they go to a worker."""


def run_python(
    source: str,
    tests: str | None = None,
    *,
    files: InputFiles | None = None,
    spec: SandboxSpec | None = None,
    filename: str = "snippet.py",
    tests_filename: str = "tests.py",
) -> ExecutionResult:
    """Run ``source`` and then ``tests`` (top-level ``assert`` lines and ``test_*`` functions,
    in the snippet's namespace) in a fresh CPython-in-WASM instance under ``spec``.

    Returns an ExecutionResult (tier ``python-wasm``) with one TestOutcome per test and a
    bounded traceback of the first error. Raises PolicyViolation for a spec the tier cannot
    honour and InvalidInput for unusable input files; every other outcome is in the result.
    The guest runs in a worker process (isolation.py) that is killed if the guest outlives
    its deadline in a host call.
    """
    spec = spec or DEFAULT_SPEC
    if spec is not DEFAULT_SPEC:
        violations = admit(spec, TIER)
        if violations:
            raise PolicyViolation(violations)
    if not IN_WORKER:
        from hybrid.wasm.python import isolation

        arguments = {
            "source": source,
            "tests": tests,
            "files": files,
            "spec": spec,
            "filename": filename,
            "tests_filename": tests_filename,
        }
        return isolation.run(arguments, spec.budget.wall_seconds, BACKSTOP_SECONDS)
    compiled = guest.component()
    budget = spec.budget
    tests_state = None if tests is None else TESTS.get(compiled, tests, tests_filename)
    request = json.dumps(
        {
            "op": "run",
            "source": source,
            "tests": tests,
            "filename": filename,
            "tests_filename": tests_filename,
            "tests_state": tests_state,
            "wall_seconds": budget.wall_seconds,
        }
    )
    outcome = _Outcome()
    outcome.expects_tests = tests is not None
    if tests is not None and tests_state is None:
        outcome.compile_tests = (tests, tests_filename)
    try:
        run_id = next(_counter)
        root = staging.scratch_root()
        files_dir, outcome.staged_key = staging.stage(files, root)
        wasi = wasmtime.WasiConfig()
        wasi.argv = ["python", filename]
        wasi.env = sorted(spec.env.resolve().items())
        out = OutputPipe(root / f"{run_id}-stdout", budget.output_bytes)
        outcome.pipes = (out,)
        err = OutputPipe(root / f"{run_id}-stderr", budget.output_bytes)
        outcome.pipes = (out, err)
        wasi.stdout_file = str(out.path)
        wasi.stderr_file = str(err.path)
        # No stdin is configured: input() and sys.stdin.read() see end-of-file at once.
        wasi.preopen_dir(str(files_dir), "/", False)
        preopen_mounts(wasi, spec.mounts)
        for pipe in outcome.pipes:
            pipe.start()
        outcome.wasi = wasi
        outcome.budget = budget
    except BaseException:
        outcome.cleanup()
        raise

    # The guest runs on a worker thread so the caller's deadline holds even if the guest is
    # blocked in a host call (the guest caps its own sleeps; this is the backstop, after which
    # isolation.py kills this worker process).
    start = time.perf_counter()
    done = WORKERS.submit(lambda ready: outcome.execute(compiled, request, ready))
    if not done.wait(budget.wall_seconds + BACKSTOP_SECONDS):
        return outcome.abandon(budget, (time.perf_counter() - start) * 1000)
    return outcome.result(budget)


_EXITED = re.compile(r"Exited with i32 exit status (\d+)")
_abandoned = 0
_abandoned_lock = threading.Lock()


def abandoned_runs() -> int:
    """How many runs in this process left a guest blocked in a host call past its deadline."""
    return _abandoned


_counter = itertools.count()


class _Outcome:
    """State of one run, finished by the worker thread (which also cleans up)."""

    def __init__(self) -> None:
        self.pipes: tuple[OutputPipe, ...] = ()
        self.wasi = wasmtime.WasiConfig()
        self.budget = DEFAULT_SPEC.budget
        self.response: dict[str, Any] | None = None
        self.exit_status: int | None = None
        self.staged_key: str | None = None
        self.expects_tests = False
        self.compile_tests: tuple[str, str] | None = None  # (tests, filename) to cache after
        self.termination = Termination.OK
        self.detail = ""
        self.wall_ms = 0.0
        self.fuel_left: int | None = None
        self.output: tuple[bytes, bool, bytes, bool] = (b"", False, b"", False)

    def execute(self, compiled: Any, request: str, ready: Callable[[], None]) -> None:
        """Run the guest, call ``ready``, then release the store and prepare the next instance.

        Every byte the guest wrote is in the pipes when the call returns (WASI writes are
        synchronous), so they are read to the end before ``ready``. Dropping the store, caching
        the compiled tests and instantiating the next run's instance happen after it, while
        the caller reads its result.
        """
        budget = self.budget
        start = time.perf_counter()
        store: wasmtime.Store | None = None
        try:
            prepared = instances.take_prepared(compiled, budget)
            store = prepared[0] if prepared else wasmtime.Store(_engine.engine())
            instances.configure(store, budget, self.wasi)
            instance = prepared[1] if prepared else instances.linker().instantiate(store, compiled)
            self.response = json.loads(instances.run_func(instance, store)(store, request))
        except wasmtime.Trap as exc:
            self.termination, self.detail = classify_trap(exc)
        except wasmtime.WasmtimeError as exc:
            exited = _EXITED.search(str(exc))
            if exited:  # os._exit(): WASI's exit carries only success or failure
                self.exit_status = int(exited.group(1))
                if self.expects_tests:
                    self.termination = Termination.ERROR
                    self.detail = "the snippet called os._exit before its tests ran"
                elif self.exit_status:
                    self.termination = Termination.NONZERO_EXIT
                    self.detail = f"the snippet exited with os._exit (status {self.exit_status})"
            else:
                self.termination, self.detail = _classify_component_error(exc)
        except Exception as exc:  # a malformed response: never report it as a clean run
            self.termination = Termination.ERROR
            self.detail = f"python-wasm harness error: {type(exc).__name__}: {exc}"
        finally:
            self.wall_ms = (time.perf_counter() - start) * 1000
            try:
                self.fuel_left = None if store is None else store.get_fuel()
            except wasmtime.WasmtimeError:
                self.fuel_left = None
            out, err = self.pipes
            stdout, stdout_cut = out.finish()
            stderr, stderr_cut = err.finish()
            self.output = (stdout, stdout_cut, stderr, stderr_cut)
            self.cleanup()
            ready()
            if store is not None:
                store.close()
        if self.compile_tests is not None:
            TESTS.fill(compiled, *self.compile_tests, DEFAULT_SPEC.budget)
        if budget.memory >= instances.PREPARED_MEMORY:
            instances.prepare(compiled)

    def cleanup(self) -> None:
        for pipe in self.pipes:
            pipe.finish()
            pipe.path.unlink(missing_ok=True)
        staging.release(self.staged_key)
        self.staged_key = None

    def abandon(self, budget: Budget, wall_ms: float) -> ExecutionResult:
        """The guest is still blocked in a host call past its deadline: report the timeout now.

        The worker finishes on its own (the epoch deadline stops the guest at its next
        instruction once the host call returns) and then removes the run's files; counting
        it in ``abandoned_runs`` tells isolation.py to kill this process instead.
        """
        global _abandoned
        with _abandoned_lock:
            _abandoned += 1
        out, err = self.pipes
        stdout, stdout_cut = bytes(out.data), out.overflowed
        stderr, stderr_cut = bytes(err.data), err.overflowed
        # The deadline, not a cut, ended this run (the guest is still blocked): a process-tier
        # ending, which a cut does not replace.
        return finish_result(
            TIER,
            Termination.TIMEOUT,
            None,
            stdout=stdout,
            stderr=stderr,
            stdout_truncated=stdout_cut,
            stderr_truncated=stderr_cut,
            output_bytes=budget.output_bytes,
            wall_ms=wall_ms,
            detail=f"wall-clock deadline of {budget.wall_seconds} s reached while blocked in a host call",
        )

    def result(self, budget: Budget) -> ExecutionResult:
        stdout, stdout_cut, stderr, stderr_cut = self.output
        termination, detail = self.termination, self.detail
        response = self.response or {}
        tests = [TestOutcome(**t) for t in response.get("tests", [])]
        exit_code: int | None = response.get("exit_code", self.exit_status)
        error = response.get("error")
        if self.response is not None:
            if response.get("memory_error"):
                termination = Termination.OUT_OF_MEMORY
                detail = f"MemoryError under the memory cap of {budget.memory} bytes"
            elif exit_code:
                termination = Termination.NONZERO_EXIT
                failed = sum(not t.passed for t in tests)
                skipped = failed and all(t.message.startswith("not run:") for t in tests)
                if error and (not failed or skipped):
                    detail = _exception_line(error) + (" (tests not run)" if skipped else "")
                elif failed:
                    detail = f"{failed} of {len(tests)} tests failed"
                    if error:
                        detail += f"; first error: {_exception_line(error)}"
                else:
                    detail = f"exit status {exit_code}"
        return finish_result(
            TIER,
            termination,
            exit_code,
            stdout=stdout,
            stderr=stderr,
            stdout_truncated=stdout_cut,
            stderr_truncated=stderr_cut,
            output_bytes=budget.output_bytes,
            output_cap_closes=True,
            wall_ms=self.wall_ms,
            detail=detail,
            fuel_used=None if self.fuel_left is None else budget.fuel - self.fuel_left,
            tests=tests,
            traceback=_bound(response.get("traceback")),
        )


def _classify_component_error(exc: wasmtime.WasmtimeError) -> tuple[Termination, str]:
    """A component call reports traps as WasmtimeError text (no trap code): read the cause."""
    termination, detail = classify_error(exc)
    if termination not in (Termination.TRAP, Termination.ERROR):
        return termination, detail
    text = str(exc)
    cause = text.rpartition("Caused by:")[2].strip()
    cause = cause.splitlines()[0].strip() if cause else detail
    if "call stack exhausted" in cause:
        return Termination.TRAP, "wasm call stack exhausted (deep recursion in C code)"
    if "panicked" in text or "unexpected exception" in text:
        return Termination.ERROR, "the python-wasm harness failed: " + cause
    return termination, cause


def _exception_line(error: str) -> str:
    """The ``Type: message`` line of the guest's error text: its LAST non-blank line (a
    SyntaxError's text starts with the file, line and caret, and ends with it)."""
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1] if lines else error


def _bound(text: str | None) -> str | None:
    if text is None or len(text) <= TRACEBACK_CHARS:
        return text
    head = TRACEBACK_CHARS // 4
    tail = TRACEBACK_CHARS - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n... {cut} characters cut ...\n{text[-tail:]}"


def available_modules() -> list[str]:
    """The importable modules bundled in the guest (public names, sorted), asked of the guest itself."""
    modules: list[str] = instances.call(guest.component(), {"op": "modules"}, DEFAULT_SPEC.budget)[
        "modules"
    ]
    return modules
