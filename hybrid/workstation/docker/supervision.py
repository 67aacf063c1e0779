"""Exec supervision: the deadline watchdog, the supervisor and the exec output stream."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from typing import TYPE_CHECKING

from docker import errors

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    import docker

    from hybrid.workstation.cgroup import Cgroup, Sample
    from hybrid.workstation.docker.workstation import DockerWorkstation


_POLL_SECONDS = 0.5
_STOP_WAIT = 10.0
"""Seconds an exec waits for its supervisor to finish (an engine call it is making)."""

# The watchdog inside an exec holds its deadline when no client is left to (a killed `hybrid run`):
# `timeout` ends the command a grace after the supervisor would have, then `kill -1` ends every
# other process of the sandbox's user, those that left the process group with setsid included
# (it spares only PID 1 and itself). A sandbox without `timeout` runs the command bare. Code of
# that user can stop the watchdog; then backstop.py holds the deadline from the host.
_WATCHDOG_GRACE = 1.0
_WATCHDOG = (
    'd=$1 e=$2; shift 2; command -v timeout >/dev/null 2>&1 || exec "$@"; '
    'timeout -s KILL "$d" "$@"; s=$?; '
    'if [ $s -eq 137 ] && [ "$(date +%s)" -ge "$e" ]; then kill -KILL -1 2>/dev/null; fi; exit $s'
)


def watchdog_words(deadline: float, started: float, argv: list[str]) -> list[str]:
    """The watchdog's arguments for a command started at epoch ``started`` with ``deadline``
    seconds: its own deadline (a grace later) and the epoch past which it may ``kill -1``."""
    return [f"{deadline + _WATCHDOG_GRACE:.3f}", str(int(started + deadline)), *argv]


class _Supervisor:
    """Watches one exec: kills the container at the deadline, and notices a sandbox that died."""

    def __init__(
        self,
        ws: DockerWorkstation,
        stream: _ExecStream,
        deadline: float,
        meter: Cgroup | None = None,
    ) -> None:
        self._ws = ws
        self._stream = stream
        self._deadline = deadline
        self._meter = meter
        self.last_sample: Sample | None = None  # the cgroup's counters at the latest poll
        self._done = threading.Event()
        self.timed_out = False
        self.died = False
        self._thread = threading.Thread(
            target=self._watch, daemon=True, name=f"hybrid-supervisor-{ws.name}"
        )
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(min(_POLL_SECONDS, max(self._deadline - time.time(), 0.0))):
            if time.time() >= self._deadline:
                self.timed_out = True
                if self._meter is not None:
                    self.last_sample = self._meter.sample() or self.last_sample
                self._ws._kill()
                # Let the last output that was already in flight arrive before cutting the stream.
                self._done.wait(0.2)
                self._close()
                return
            if self._meter is not None:
                self.last_sample = self._meter.sample() or self.last_sample
            try:
                alive = self._ws._alive()
            except errors.DockerException:
                continue
            if not alive:
                self.died = True
                self._close()
                return

    def _close(self) -> None:
        self._stream.close()

    def stop(self) -> None:
        self._done.set()
        # The watcher may be inside an engine call (the kill at the deadline): the exec's own
        # cleanup must not hang on a hung engine; the watcher is a daemon thread and ends alone.
        self._thread.join(_STOP_WAIT)


class _ExecStream:
    """One exec's output, read frame by frame; iterating yields ("stdout"|"stderr", bytes).

    Frames are read through the HTTP response's own buffered reader, not its raw socket as the
    SDK's ``exec_start(stream=True)`` does: a command that prints at once can have its first
    frame arrive in the same packet as the response headers, already inside that buffer, and
    reading the raw socket lost it (a first line missing about once in 60 concurrent runs).
    Iteration ends quietly when the engine ends the stream or ``close`` (from any thread) cuts it.
    """

    def __init__(
        self, reader: io.BufferedReader, sock: socket.socket, response: Any = None
    ) -> None:
        self._reader = reader
        self._sock = sock
        self._response = response
        self._closed = False

    @classmethod
    def start(cls, api: docker.APIClient, exec_id: str) -> _ExecStream:
        """Start the exec and read its output."""
        response = cls.post_start(api, exec_id)
        return cls(response.raw._fp.fp, cls.socket_of(response), response)

    @classmethod
    def over(cls, sock: socket.socket) -> _ExecStream:
        """The output of an exec started earlier (slot.py), read from its connection."""
        return cls(sock.makefile("rb"), sock)

    @staticmethod
    def socket_of(response: Any) -> socket.socket:
        """The connection under a started exec's response (the SDK keeps it three levels in)."""
        sock: socket.socket = response.raw._fp.fp.raw._sock
        return sock

    @staticmethod
    def post_start(api: docker.APIClient, exec_id: str) -> Any:
        """Start the exec attached; the engine's response, its headers read, the stream not."""
        response = api._post_json(
            api._url("/exec/{0}/start", exec_id),
            headers={"Connection": "Upgrade", "Upgrade": "tcp"},
            data={"Tty": False, "Detach": False},
            stream=True,
        )
        api._raise_for_status(response)
        return response

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        while True:
            header = self._read(8)
            if len(header) < 8:
                return
            size = int.from_bytes(header[4:8], "big")
            data = self._read(size)
            if data:
                yield ("stderr" if header[0] == 2 else "stdout"), data
            if len(data) < size:
                return

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size and not self._closed:
            try:
                chunk = self._reader.read1(size - len(data))
            except (OSError, ValueError, AttributeError):
                break  # closed under us (the supervisor) or dropped by the engine
            if not chunk:
                break
            data.extend(chunk)
        return bytes(data)

    def close(self) -> None:
        """Cut the stream (idempotent, safe from another thread): a blocked read returns."""
        self._closed = True
        with contextlib.suppress(Exception):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._reader.close()
        if self._response is not None:
            with contextlib.suppress(Exception):
                self._response.close()


class _Chunks(io.RawIOBase):
    """Streams get_archive's chunks into put_archive without holding the tar in memory."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buffer))
        b[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n
