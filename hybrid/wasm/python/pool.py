"""Throughput across cores: a pool of worker processes, each with its own Engine and component.

Threads in one process share an address space, so every instance's page faults and unmaps flush
the other cores' TLBs; on a 2-core VM two threads run fewer snippets per second than one. Worker
processes do not share that cost, so a batch of isolated runs scales with the cores. Each worker
process is pinned to one CPU in turn, so its threads (the guest's and wasmtime's) never wake
another CPU.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing.sharedctypes import Synchronized
from typing import Any

from hybrid.results import ExecutionResult


def _warm(started: Synchronized[int]) -> None:
    from hybrid.wasm.python import run_python
    from hybrid.wasm.python.runner import pin

    with started.get_lock():
        index = started.value
        started.value += 1
    pin(index)  # before any thread starts: the whole worker process lives on one CPU
    run_python("pass")  # loads the compiled component once per worker


def _run(kwargs: Mapping[str, Any]) -> ExecutionResult:
    from hybrid.wasm.python import run_python

    return run_python(**kwargs)


class PythonPool:
    """A context manager running ``run_python`` calls in ``processes`` worker processes."""

    def __init__(self, processes: int | None = None) -> None:
        self.processes = processes or os.cpu_count() or 1
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
        """Stop the workers (idempotent)."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> PythonPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
