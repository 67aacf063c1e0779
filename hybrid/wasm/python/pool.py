"""Throughput across cores: a pool of worker processes, each with its own Engine and component.

Threads in one process share an address space, so every instance's page faults and unmaps flush
the other cores' TLBs; on a 2-core VM two threads run fewer snippets per second than one. Worker
processes do not share that cost, so a batch of isolated runs scales with the cores. Each worker
process is pinned to one CPU in turn, so its threads (the guest's and wasmtime's) never wake
another CPU. A worker whose parent dies (killed, with no chance to shut the pool down) removes
its scratch directory and exits; what a killed worker leaves is reaped by hybrid/owner.py.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing.sharedctypes import Synchronized
from typing import Any

from hybrid import owner
from hybrid.results import ExecutionResult


def _warm(started: Synchronized[int]) -> None:
    from hybrid.wasm.python import run_python
    from hybrid.wasm.python.workers import pin

    with started.get_lock():
        index = started.value
        started.value += 1
    pin(index)  # before any thread starts: the whole worker process lives on one CPU
    _exit_with_parent()
    run_python("pass")  # loads the compiled component once per worker


def _exit_with_parent() -> None:
    # A worker blocks on its task queue, which every worker holds open too: without this a
    # killed parent would leave its workers (and their directories) running forever.
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # returns once the parent is gone
        atexit._run_exitfuncs()  # this worker's scratch directories
        os._exit(1)

    threading.Thread(target=watch, name="hybrid-pool-parent", daemon=True).start()


def _run(kwargs: Mapping[str, Any]) -> ExecutionResult:
    from hybrid.wasm.python import run_python

    return run_python(**kwargs)


class PythonPool:
    """A context manager running ``run_python`` calls in ``processes`` worker processes."""

    def __init__(self, processes: int | None = None) -> None:
        self.processes = processes or os.cpu_count() or 1
        owner.reap_once()
        # spawn, not fork: the parent may hold wasmtime's threads and locks.
        context = multiprocessing.get_context("spawn")
        self._executor = ProcessPoolExecutor(
            self.processes,
            mp_context=context,
            initializer=_warm,
            initargs=(context.Value("i", 0),),
        )

    def submit(
        self, source: str, tests: str | None = None, **kwargs: Any
    ) -> Future[ExecutionResult]:
        """Queue one run (same arguments as run_python); the future holds its ExecutionResult."""
        return self._executor.submit(_run, {"source": source, "tests": tests, **kwargs})

    def map(self, jobs: Iterable[Mapping[str, Any]]) -> Iterator[ExecutionResult]:
        """Run each job (a mapping of run_python's arguments) and yield the results in order."""
        return self._executor.map(_run, jobs, chunksize=8)

    def close(self) -> None:
        """Stop the workers (idempotent); remove what any worker that crashed left."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        owner.reap()

    def __enter__(self) -> PythonPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
