"""Bounded capture of a guest's stdout/stderr through named pipes.

Why pipes and not files or callbacks: a file lets a hostile guest fill the disk before its deadline,
and wasmtime's custom-output callbacks can fire from a runtime worker thread after the run, which
aborts the interpreter at exit. A FIFO keeps the data in memory; one drain thread reads every
active pipe, keeps the first ``limit`` bytes and then closes the read end, so further writes fail
with EPIPE and a flooding guest stops at once.
"""

from __future__ import annotations

import os
import selectors
import threading
from pathlib import Path


class OutputPipe:
    """The read side of one guest output stream, capped at ``limit`` bytes."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.limit = limit
        self.data = bytearray()
        self.overflowed = False
        self._lock = threading.Lock()
        os.mkfifo(path, 0o600)
        # Non-blocking read end first, so the writer's open (by wasmtime) does not block.
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def start(self) -> None:
        """Begin draining; call after the writer has opened the pipe, so an early EOF cannot happen."""
        _DRAINER.register(self)

    def fileno(self) -> int:
        return self._fd if self._fd is not None else -1

    def pump(self) -> bool:
        """Read what is available; False once the pipe is finished (EOF or over the limit)."""
        with self._lock:
            while self._fd is not None:
                try:
                    chunk = os.read(self._fd, 65536)
                except BlockingIOError:
                    return True
                if not chunk:
                    return False
                room = self.limit - len(self.data)
                if len(chunk) > room:
                    self.data += chunk[: max(room, 0)]
                    self.overflowed = True
                    self._close()
                    return False
                self.data += chunk
            return False

    def finish(self) -> tuple[bytes, bool]:
        """After the writer has closed: collect the rest, release the pipe, return (data, overflowed)."""
        _DRAINER.unregister(self)
        self.pump()
        with self._lock:
            self._close()
        return bytes(self.data), self.overflowed

    def _close(self) -> None:
        if self._fd is not None:
            _DRAINER.unregister(self)
            os.close(self._fd)
            self._fd = None


class _Drainer:
    """One daemon thread that empties every registered pipe as data arrives."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def register(self, pipe: OutputPipe) -> None:
        with self._lock:
            self._selector.register(pipe.fileno(), selectors.EVENT_READ, pipe)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="hybrid-wasm-output", daemon=True
                )
                self._thread.start()

    def unregister(self, pipe: OutputPipe) -> None:
        with self._lock:
            fd = pipe.fileno()
            if fd >= 0 and fd in self._selector.get_map():
                self._selector.unregister(fd)

    def _loop(self) -> None:
        while True:
            try:
                events = self._selector.select(timeout=0.1)
            except OSError:
                continue
            for key, _ in events:
                pipe: OutputPipe = key.data
                try:
                    if not pipe.pump():
                        self.unregister(pipe)
                except OSError:
                    self.unregister(pipe)


_DRAINER = _Drainer()
