"""Run a Python snippet (and its tests) in a fresh CPython-in-WebAssembly instance.

Every run instantiates the cached compiled component into a new Store, so no state survives
between runs. The snippet sees only its input files (read-only, in its working directory), has
no sockets, no host environment, an empty stdin, and the spec's fuel, memory and wall-clock caps.
Its stdout/stderr go through bounded pipes; the harness inside the guest returns the per-test
outcomes and a traceback restricted to the user's own files.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import os
import queue
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import wasmtime
from wasmtime.component import Linker

from hybrid import owner
from hybrid.errors import InvalidInput, PolicyViolation
from hybrid.paths import read_input
from hybrid.policy import Budget, SandboxSpec, admit
from hybrid.results import ExecutionResult, Termination, TestOutcome, Usage
from hybrid.wasm import engine as _engine
from hybrid.wasm.pipes import OutputPipe
from hybrid.wasm.python import guest
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

MAX_INPUT_BYTES = 64 * 1024**2
"""The most input-file bytes one run may bring (they are copied into a staged directory)."""

InputFiles = Mapping[str, bytes | str | Path] | Sequence[str | Path]
"""Input files: a mapping of name -> content (bytes, text or a host Path), or host paths
(each visible under its base name)."""

IN_WORKER = False
"""True in an isolation worker process: runs happen here; elsewhere they go to a worker."""

_linker_lock = threading.Lock()
_shared_linker: Linker | None = None


def _linker() -> Linker:
    # One Linker for every thread: building one (add_wasip2) costs ~2 ms, and instantiating
    # through it only reads it (wasmtime's Linker is Sync), so concurrent runs may share it.
    global _shared_linker
    if _shared_linker is None:
        with _linker_lock:
            if _shared_linker is None:
                linker = Linker(_engine.engine())
                linker.add_wasip2()
                _shared_linker = linker
    return _shared_linker


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
    tests_state = None if tests is None else _TESTS.get(compiled, tests, tests_filename)
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
        root = _scratch_root()
        files_dir, outcome.staged_key = _staged(files, root)
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
    done = _WORKERS.submit(lambda ready: outcome.execute(compiled, request, ready))
    if not done.wait(budget.wall_seconds + BACKSTOP_SECONDS):
        return outcome.abandon(budget, (time.perf_counter() - start) * 1000)
    return outcome.result(budget)


PREPARED_MEMORY = 64 * 1024**2
"""Memory cap under which the next instance is prepared ahead of its run: a run whose own cap is
at least this uses it (its cap then holds for everything the run grows); a smaller cap
instantiates on the spot under that cap."""

PREPARE_BUDGET = Budget(wall_seconds=5.0, memory=PREPARED_MEMORY, fuel=10_000_000)
"""Instantiation runs a few thousand instructions of start-up code (no WASI use): a small
allowance; the run sets its own budget before its call."""

_prepared = threading.local()


def _prepare(compiled: Any) -> None:
    """Instantiate the next run's instance now, on this worker, while the caller reads its result.

    Instantiation runs no guest code and the WASI context (files, pipes, environment) is set
    just before the call, so a prepared instance is exactly as fresh as one made on the spot;
    each is used by one run only. It takes instantiation (~0.6 ms) off the next run's latency
    unless that run is already waiting.
    """
    store = wasmtime.Store(_engine.engine())
    try:
        _configure(store, PREPARE_BUDGET)
        instance = _linker().instantiate(store, compiled)
    except wasmtime.WasmtimeError:
        store.close()  # the run instantiates on the spot and reports why
        return
    _prepared.entry = (compiled, store, instance)


def _configure(
    store: wasmtime.Store, budget: Budget, wasi: wasmtime.WasiConfig | None = None
) -> None:
    """Give ``store`` the budget's fuel, memory cap and deadline, and a WASI context."""
    store.set_fuel(budget.fuel)
    store.set_limits(memory_size=budget.memory)
    store.set_epoch_deadline(_engine.deadline_ticks(budget.wall_seconds))
    store.set_wasi(wasmtime.WasiConfig() if wasi is None else wasi)


def _take_prepared(compiled: Any, budget: Budget) -> tuple[wasmtime.Store, Any] | None:
    entry = getattr(_prepared, "entry", None)
    if entry is None:
        return None
    if entry[0] is not compiled or budget.memory < PREPARED_MEMORY:
        return None
    _prepared.entry = None
    return entry[1], entry[2]


_Job = Callable[[Callable[[], None]], None]


class _Workers:
    """Reusable daemon threads for guest calls, each pinned to one CPU.

    A new thread per run would map and unmap a stack every time; each unmap is a cross-CPU
    TLB flush. Idle workers are reused; a worker stuck in a host call past its deadline stays
    busy, so isolation.py kills the whole process it runs in (daemon: never blocks exit).

    Pinning: a guest's file reads are host calls that wasmtime hands to its blocking-pool
    threads, ~7 handoffs per ``open()``. On these VMs a handoff that wakes another CPU costs
    ~40 us, one on the same CPU a few; the pool threads are started from a worker and inherit
    its CPU, so handoffs stay on one CPU. Workers take the allowed CPUs in turn.
    """

    def __init__(self) -> None:
        self._idle: list[queue.SimpleQueue[tuple[_Job, threading.Event]]] = []
        self._lock = threading.Lock()
        self._started = itertools.count()

    def submit(self, job: _Job) -> threading.Event:
        """Run ``job(ready)`` on a worker; the returned Event is set when it calls ``ready``."""
        done = threading.Event()
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(
                target=self._serve,
                args=(inbox, next(self._started)),
                name="hybrid-py-worker",
                daemon=True,
            ).start()
        inbox.put((job, done))
        return done

    def _serve(self, inbox: queue.SimpleQueue[tuple[_Job, threading.Event]], index: int) -> None:
        pin(index)
        while True:
            job, done = inbox.get()

            def ready(done: threading.Event = done) -> None:
                if not done.is_set():
                    with self._lock:
                        self._idle.append(inbox)  # idle first: the caller's next run reuses us
                    done.set()

            try:
                job(ready)
            finally:
                ready()


def pin(index: int) -> None:
    """Pin the calling thread (and the threads it starts) to the ``index``-th allowed CPU,
    round robin; best effort."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[index % len(cpus)]})
    except (AttributeError, OSError):  # no affinity API, or a CPU set that changed under us
        pass


_WORKERS = _Workers()


_EXITED = re.compile(r"Exited with i32 exit status (\d+)")
_abandoned = 0
_abandoned_lock = threading.Lock()


def abandoned_runs() -> int:
    """How many runs in this process left a guest blocked in a host call past its deadline."""
    return _abandoned


_counter = itertools.count()
_root_lock = threading.Lock()
_root: Path | None = None


def _scratch_root() -> Path:
    """A private directory per process for the runs' pipes and input files (removed at exit;
    named for the process, so a later one reaps it if this one is killed)."""
    global _root
    if _root is None:
        with _root_lock:
            if _root is None:
                owner.reap_once()
                root = owner.make_dir("hybrid-py-")
                (root / "empty").mkdir(mode=0o500)
                atexit.register(shutil.rmtree, root, ignore_errors=True)
                _root = root
    return _root


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
            prepared = _take_prepared(compiled, budget)
            store = prepared[0] if prepared else wasmtime.Store(_engine.engine())
            _configure(store, budget, self.wasi)
            instance = prepared[1] if prepared else _linker().instantiate(store, compiled)
            func = instance.get_func(store, "run")
            if func is None:
                raise wasmtime.WasmtimeError("the python-wasm guest exports no run function")
            self.response = json.loads(func(store, request))
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
            _TESTS.fill(compiled, *self.compile_tests)
        if budget.memory >= PREPARED_MEMORY:
            _prepare(compiled)

    def cleanup(self) -> None:
        for pipe in self.pipes:
            pipe.finish()
            pipe.path.unlink(missing_ok=True)
        _release(self.staged_key)
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
        return ExecutionResult(
            tier=TIER,
            termination=Termination.TIMEOUT,
            exit_code=None,
            stdout=stdout.decode("utf-8", errors="replace"),
            stderr=stderr.decode("utf-8", errors="replace"),
            stdout_truncated=stdout_cut,
            stderr_truncated=stderr_cut,
            usage=Usage(wall_ms=wall_ms),
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
                    detail = _first_line(error) + (" (tests not run)" if skipped else "")
                elif failed:
                    detail = f"{failed} of {len(tests)} tests failed"
                    if error:
                        detail += f"; first error: {_first_line(error)}"
                else:
                    detail = f"exit status {exit_code}"
        fuel_used = None if self.fuel_left is None else budget.fuel - self.fuel_left
        if termination is Termination.TIMEOUT and fuel_used == 0:
            # An interrupt inside pure wasm code does not write the fuel counter back.
            fuel_used = None
        if stdout_cut or stderr_cut:
            termination = Termination.OUTPUT_LIMIT
            detail = f"output over {budget.output_bytes} bytes was cut"
        return ExecutionResult(
            tier=TIER,
            termination=termination,
            exit_code=exit_code,
            stdout=stdout.decode("utf-8", errors="replace"),
            stderr=stderr.decode("utf-8", errors="replace"),
            stdout_truncated=stdout_cut,
            stderr_truncated=stderr_cut,
            usage=Usage(wall_ms=self.wall_ms, fuel_used=fuel_used),
            detail=detail,
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


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def _bound(text: str | None) -> str | None:
    if text is None or len(text) <= TRACEBACK_CHARS:
        return text
    head = TRACEBACK_CHARS // 4
    tail = TRACEBACK_CHARS - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n... {cut} characters cut ...\n{text[-tail:]}"


STAGED_SETS = 16
"""How many distinct sets of input files stay staged (an agent's loop reuses the same inputs)."""

STAGED_BYTES = 256 * 1024**2
"""...and at most this many bytes of them."""

_staged_lock = threading.Lock()
_staged_sets: OrderedDict[str, _Staged] = OrderedDict()


class _Staged:
    """One staged directory, its size and how many runs use it now (never evicted then)."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.users = 0


def _release(key: str | None) -> None:
    if key is None:
        return
    with _staged_lock:
        entry = _staged_sets.get(key)
        if entry is not None:
            entry.users -= 1


def _staged(files: InputFiles | None, root: Path) -> tuple[Path, str | None]:
    """A read-only directory holding exactly ``files``: the guest's working directory.

    Directories are keyed by the files' names and contents, so repeated runs with the same
    inputs reuse one (the guest cannot write to it), and the least recently used is removed.
    """
    if not files:
        return root / "empty", None
    items = _read_inputs(files)
    digest = hashlib.sha256()
    for name, data in items:
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    key = digest.hexdigest()[:24]
    with _staged_lock:
        entry = _staged_sets.get(key)
        if entry is not None:
            _staged_sets.move_to_end(key)
            entry.users += 1
            return entry.path, key
        tmp = Path(tempfile.mkdtemp(prefix=".stage-", dir=root))
        for name, data in items:
            dest = tmp.joinpath(*PurePosixPath(name).parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        path = root / f"inputs-{key}"
        os.replace(tmp, path)
        entry = _staged_sets[key] = _Staged(path, sum(len(data) for _, data in items))
        entry.users += 1
        idle = [k for k, e in _staged_sets.items() if e.users == 0]  # oldest first
        total = sum(e.size for e in _staged_sets.values())
        while idle and (len(_staged_sets) > STAGED_SETS or total > STAGED_BYTES):
            old = _staged_sets.pop(idle.pop(0))
            total -= old.size
            shutil.rmtree(old.path, ignore_errors=True)
        return path, key


def _read_inputs(files: InputFiles) -> list[tuple[str, bytes]]:
    if isinstance(files, Mapping):
        pairs = list(files.items())
    else:
        pairs = [(Path(p).name, Path(p)) for p in files]
    items: list[tuple[str, bytes]] = []
    total = 0
    for name, content in pairs:
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts or rel.parts == (".",):
            raise InvalidInput(f"input file name {name!r} must be a relative path without '..'")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # WASI paths are UTF-8: the guest could not name it
            shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            raise InvalidInput(
                f"input file name {shown!r} is not UTF-8; give it a UTF-8 name, e.g. "
                "files={'data.csv': path}"
            ) from None
        if isinstance(content, Path):
            data = read_input(content, "input file")
        else:
            data = content.encode() if isinstance(content, str) else bytes(content)
        total += len(data)
        _check_total(total)
        items.append((rel.as_posix(), data))
    return items


def _check_total(total: int) -> None:
    if total > MAX_INPUT_BYTES:
        raise InvalidInput(
            f"input files total over {MAX_INPUT_BYTES // 1024**2} MiB; the python-wasm tier is for "
            "small inputs (use the container tier for large data)"
        )


def _call(compiled: Any, request: dict[str, Any]) -> dict[str, Any]:
    """One harness request (no snippet) in a fresh instance under the default budget."""
    store = wasmtime.Store(_engine.engine())
    try:
        _configure(store, DEFAULT_SPEC.budget)
        instance = _linker().instantiate(store, compiled)
        func = instance.get_func(store, "run")
        if func is None:
            raise wasmtime.WasmtimeError("the python-wasm guest exports no run function")
        reply: dict[str, Any] = json.loads(func(store, json.dumps(request)))
        return reply
    finally:
        store.close()


class _TestsCache:
    """Compiled test files, so the runs of an agent's loop (new snippet, same tests) skip
    parsing, transforming and compiling them (~0.4 ms of each run).

    Each entry comes from a compile-only request in an instance of its own, made after the
    run that first saw the tests: a snippet never runs where an entry is made, so it cannot
    forge what later runs execute.
    """

    SIZE = 64

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, str], tuple[Any, str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, compiled: Any, tests: str, filename: str) -> str | None:
        with self._lock:
            entry = self._entries.get((filename, tests))
            if entry is None or entry[0] is not compiled:
                return None
            self._entries.move_to_end((filename, tests))
            return entry[1]

    def fill(self, compiled: Any, tests: str, filename: str) -> None:
        if self.get(compiled, tests, filename) is not None:
            return
        try:
            state = _call(
                compiled, {"op": "compile_tests", "tests": tests, "tests_filename": filename}
            )
        except (wasmtime.WasmtimeError, wasmtime.Trap, ValueError):
            return  # runs with these tests keep compiling them
        if not isinstance(state.get("tests_state"), str):
            return  # the tests do not compile: each run reports why
        with self._lock:
            self._entries[(filename, tests)] = (compiled, state["tests_state"])
            while len(self._entries) > self.SIZE:
                self._entries.popitem(last=False)


_TESTS = _TestsCache()


def available_modules() -> list[str]:
    """The importable modules bundled in the guest (public names, sorted), asked of the guest itself."""
    modules: list[str] = _call(guest.component(), {"op": "modules"})["modules"]
    return modules
