"""Reusable guest threads, each pinned to one CPU."""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Callable

Job = Callable[[Callable[[], None]], None]
"""A guest call: it runs on a worker and calls its argument (``ready``) once its result is in."""


class Workers:
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
        self._idle: list[queue.SimpleQueue[tuple[Job, threading.Event]]] = []
        self._lock = threading.Lock()
        self._started = itertools.count()

    def submit(self, job: Job) -> threading.Event:
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

    def _serve(self, inbox: queue.SimpleQueue[tuple[Job, threading.Event]], index: int) -> None:
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


WORKERS = Workers()
"""The process's guest threads."""
