"""Guests run in worker processes the host can kill, so none outlives its deadline.

Why not in process: epoch interruption stops WebAssembly code only. A guest blocked in a host
call (a sleep is wasmtime's own ``wasi:clocks/monotonic-clock.subscribe-duration`` followed by
``wasi:io/poll.poll``, which blocks the calling thread in Rust until the timer fires) cannot be
interrupted, and wasmtime-py 50 cannot shadow those imports the way ``hybrid/wasm/poll.py`` does
for preview 1: a component linker instance is replaced whole, and a Python host function can
neither create nor read wasmtime's own ``pollable`` resources (which ``wasi:io/streams`` also
returns). The guest's own sleep caps are no boundary either (the real functions stay reachable).

So each run goes to a worker process (one run at a time per worker; idle workers are reused, so
a warm run costs one pipe round trip more). The worker runs the guest as before
(``runner.run_python`` in process, with its backstop). When its backstop abandons a guest stuck
in a host call, it replies with the timeout and its partial output, and the parent kills it at
once: its stuck thread, pipes, descriptors and scratch directory go with it. A worker that does
not answer within the backstop plus ``REPLY_GRACE`` is killed the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from hybrid.errors import EngineUnavailable, HybridError, PolicyViolation
from hybrid.policy import SandboxSpec
from hybrid.results import ExecutionResult, Termination, Usage

REPLY_GRACE = 1.5
"""Seconds past the worker's own backstop before the parent stops waiting and kills it."""

START_TIMEOUT = 1200.0
"""Seconds a new worker may take to load (first use builds and compiles the guest)."""

IDLE_WORKERS = 4
"""Idle workers kept for reuse; more are closed when they finish."""

ORPHAN_CHECK = 0.5
"""Seconds between a worker's checks that its parent still lives."""

CLOSE_WAIT = 2.0
"""Seconds a closed idle worker has to exit on its own before it is killed."""


class _Worker:
    """One worker process and the two pipes to it."""

    def __init__(self, index: int) -> None:
        from_parent, to_worker = os.pipe()  # (read end, write end)
        from_worker, to_parent = os.pipe()
        package_root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from hybrid.wasm.python import isolation; "
                    "isolation.serve(*map(int, sys.argv[1:]))",
                    str(from_parent),
                    str(to_parent),
                    str(index),
                ],
                pass_fds=(from_parent, to_parent),
                # Guest output goes through the run's pipes; the worker must not hold the
                # caller's stdout open (a reader waiting for its end). Its stderr stays, for
                # a crash's last words.
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
                # Not in the terminal's process group: Ctrl-C reaches the parent, which kills us.
                start_new_session=True,
            )
        except OSError as exc:
            for fd in (to_worker, from_worker):
                os.close(fd)
            raise EngineUnavailable(f"cannot start a python-wasm worker: {exc}") from None
        finally:
            os.close(from_parent)  # the worker's ends: only it holds them now
            os.close(to_parent)
        self._send = Connection(to_worker, readable=False)
        self._recv = Connection(from_worker, writable=False)
        self.scratch: str | None = None

    def started(self) -> None:
        """Wait for the worker's hello (it loads the guest first); raise what stopped it."""
        if self.scratch is not None:
            return
        if not self._recv.poll(START_TIMEOUT):
            self.kill()
            raise EngineUnavailable(f"the python-wasm worker did not start in {START_TIMEOUT:g} s")
        try:
            kind, payload = self._recv.recv()
        except (EOFError, OSError):
            self.kill()
            raise EngineUnavailable("the python-wasm worker exited while starting") from None
        if kind == "error":
            self.kill()
            raise _decode(payload)
        self.scratch = payload

    def call(self, request: dict[str, Any], wait: float) -> tuple[str, Any, bool] | None:
        """Send one run; its reply, or None when none came within ``wait`` seconds."""
        self._send.send(request)
        if not self._recv.poll(wait):
            return None
        reply: tuple[str, Any, bool] = self._recv.recv()
        return reply

    def descriptors(self) -> tuple[int, int]:
        """The two pipe descriptors this process holds for the worker."""
        return self._send.fileno(), self._recv.fileno()

    def kill(self) -> None:
        """End the process (every thread and descriptor of its guests) and remove its files."""
        self.process.kill()  # SIGKILL; nothing if it already exited
        self.process.wait()
        self._close_pipes()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def close(self) -> None:
        """Let an idle worker finish: end of input makes it exit and remove its own files."""
        self._close_pipes()
        try:
            self.process.wait(CLOSE_WAIT)
        except subprocess.TimeoutExpired:
            self.kill()

    def _close_pipes(self) -> None:
        for conn in (self._send, self._recv):
            conn.close()


class _Pool:
    """Idle workers, reused one run at a time."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._started = itertools.count()

    def take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.process.poll() is None:
                    return worker
                worker.kill()
        return _Worker(next(self._started))

    def give_back(self, worker: _Worker) -> None:
        with self._lock:
            if len(self._idle) < IDLE_WORKERS:
                self._idle.append(worker)
                return
        worker.close()

    def idle(self) -> dict[int, tuple[int, int]]:
        with self._lock:
            return {w.process.pid: w.descriptors() for w in self._idle}

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()


_POOL = _Pool()
atexit.register(_POOL.close)


def idle_workers() -> dict[int, tuple[int, int]]:
    """The worker processes waiting for a run: pid -> the two pipe descriptors held for it here.

    They are kept on purpose (a warm run costs one pipe round trip), so a leftover check that
    looks at child processes and descriptors must leave exactly these out."""
    return _POOL.idle()


def run(request: dict[str, Any], wall_seconds: float, backstop: float) -> ExecutionResult:
    """Run one ``run_python`` request (its keyword arguments) in a worker process."""
    request = _for_worker(request)
    worker = _POOL.take()
    try:
        worker.started()
        reply = worker.call(request, wall_seconds + backstop + REPLY_GRACE)
    except (EOFError, OSError):
        worker.kill()
        code = worker.process.returncode
        return _ended(Termination.ERROR, f"the python-wasm worker process died (exit {code})")
    except BaseException:
        worker.kill()  # interrupted (Ctrl-C): the guest must not run on unattended
        raise
    if reply is None:
        worker.kill()
        return _ended(
            Termination.TIMEOUT,
            f"wall-clock deadline of {wall_seconds} s reached; the guest did not return "
            "and its worker process was killed",
            wall_ms=(wall_seconds + backstop + REPLY_GRACE) * 1000,
        )
    kind, payload, abandoned = reply
    if abandoned:
        worker.kill()  # a guest is still blocked in a host call in there
    else:
        _POOL.give_back(worker)
    if kind == "error":
        raise _decode(payload)
    return ExecutionResult.model_validate_json(payload)


def _ended(termination: Termination, detail: str, wall_ms: float = 0.0) -> ExecutionResult:
    return ExecutionResult(
        tier="python-wasm",
        termination=termination,
        exit_code=None,
        usage=Usage(wall_ms=wall_ms),
        detail=detail,
    )


def _for_worker(request: dict[str, Any]) -> dict[str, Any]:
    """The request as the worker must see it: it was started earlier, maybe elsewhere.

    Its working directory and environment are the parent's at spawn time, so relative paths
    become absolute here and inherited variables are read here, now (as an in-process run did).
    """
    spec: SandboxSpec = request["spec"]
    if spec.env.inherit or spec.mounts:
        env = spec.env
        if env.inherit:
            env = env.model_copy(update={"set": env.resolve(), "inherit": []})
        mounts = [
            m.model_copy(update={"source": m.source.expanduser().absolute()}) for m in spec.mounts
        ]
        spec = spec.model_copy(update={"env": env, "mounts": mounts})
    # JSON, not pickle: a quarter of the cost for these models, on every run.
    fixed = {**request, "spec": spec.model_dump_json()}
    files = request.get("files")
    if files and isinstance(files, Mapping):
        fixed["files"] = {
            k: Path(v).absolute() if isinstance(v, Path) else v for k, v in files.items()
        }
    elif files:
        fixed["files"] = [Path(p).absolute() for p in files]
    return fixed


def _encode(exc: HybridError) -> tuple[type[HybridError], Any]:
    if isinstance(exc, PolicyViolation):
        return PolicyViolation, list(exc.violations)
    return type(exc), exc.message


def _decode(payload: tuple[type[HybridError], Any]) -> HybridError:
    cls, arg = payload
    return cls(arg)


def _orphaned(parent: int) -> None:
    # A parent that dies (even by SIGKILL) must not leave its worker behind, whatever the worker
    # is doing: loading the guest, or serving a guest blocked in a host call.
    from hybrid.wasm.python import staging

    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK)
    shutil.rmtree(staging.scratch_root(), ignore_errors=True)  # no atexit after os._exit
    os._exit(1)


def serve(read_fd: int, write_fd: int, index: int) -> None:
    """The worker process: load the guest, say hello, then run requests until the parent goes."""
    from hybrid.wasm.python import guest, runner, staging, workers

    # Workers take the CPUs in turn (before any thread starts, so every thread of this one
    # stays on its CPU), as the guest threads of one process did.
    workers.pin(index)
    runner.IN_WORKER = True
    threading.Thread(
        target=_orphaned, args=(os.getppid(),), name="hybrid-py-parent", daemon=True
    ).start()
    requests = Connection(read_fd, writable=False)
    replies = Connection(write_fd, readable=False)
    try:
        guest.component()
        replies.send(("hello", str(staging.scratch_root())))
    except HybridError as exc:
        with contextlib.suppress(OSError):
            replies.send(("error", _encode(exc)))
        return
    except OSError:
        return  # the parent went away while the guest loaded
    while True:
        try:
            request = requests.recv()
        except (EOFError, OSError):
            return  # the parent closed us (or died): atexit removes the scratch directory
        before = runner.abandoned_runs()
        try:
            request["spec"] = SandboxSpec.model_validate_json(request["spec"])
            result = runner.run_python(**request)
            reply: tuple[str, Any, bool] = ("ok", result.model_dump_json(), False)
        except HybridError as exc:
            reply = ("error", _encode(exc), False)
        except Exception as exc:  # never let the worker die silently: the caller gets a line
            reply = (
                "error",
                (HybridError, f"python-wasm worker: {type(exc).__name__}: {exc}"),
                False,
            )
        abandoned = runner.abandoned_runs() != before
        try:
            replies.send((reply[0], reply[1], abandoned))
        except OSError:
            return
        if abandoned:
            # The parent kills us now; stop taking work in case it is slow to.
            os._exit(0)
