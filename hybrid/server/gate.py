"""The TCP front door of ``hybrid serve --tcp``: no connection reaches a worker before its token.

Anyone who can reach the port can connect, so the daemon (not a worker) takes every TCP
connection, on one thread, without blocking on any of them: each must send its whole ``T``
frame (at most ``wire.MAX_TOKEN`` bytes) within ``wire.AUTH_SECONDS`` of connecting, and at most
``MAX_PENDING`` may be waiting at once. A wrong token
gets one line and exit code 77; a right one is handed, as a descriptor, to the workers' queue
(a SOCK_SEQPACKET pair: each worker takes one whole message, so one connection goes to exactly
one worker). A worker is thus only ever busy with an authenticated client.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from hybrid import tokens
from hybrid.server import wire

log = logging.getLogger(__name__)

MAX_PENDING = 64
"""TCP connections that may be waiting to authenticate at once (a new one beyond that
pushes out the one that has waited longest)."""

BAD_TOKEN = 77
"""Exit code a client gets for a wrong token (EX_NOPERM)."""

BUSY = 75
"""Exit code when the workers' queue is full (EX_TEMPFAIL)."""


@dataclass
class _Pending:
    conn: socket.socket
    deadline: float
    data: bytes = field(default=b"")


def queue() -> tuple[socket.socket, socket.socket]:
    """The hand-off queue: (the daemon's sending end, the end every worker receives from)."""
    send, receive = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    send.setblocking(False)
    return send, receive


def take(receive: socket.socket) -> socket.socket | None:
    """An authenticated connection from the queue, or None when another worker was faster."""
    try:
        _, fds, _, _ = socket.recv_fds(receive, 1, 1, socket.MSG_CMSG_CLOEXEC | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return None
    if not fds:
        return None
    for extra in fds[1:]:
        with contextlib.suppress(OSError):
            os.close(extra)
    return socket.socket(fileno=fds[0])


class Gate:
    """Authenticates TCP connections on a thread of its own and queues the good ones."""

    def __init__(self, listener: socket.socket, token: str, handoff: socket.socket) -> None:
        self.listener = listener
        self.token = token
        self.handoff = handoff
        self.pending: dict[int, _Pending] = {}
        self.selector = selectors.DefaultSelector()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hybrid-gate", daemon=True)

    def start(self) -> None:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.thread.start()

    def close(self) -> None:
        """Stop taking connections and drop those still waiting (idempotent)."""
        self.stopping.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(5)

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                soonest = min((p.deadline for p in self.pending.values()), default=now + 0.5)
                for key, _ in self.selector.select(max(0.0, min(0.5, soonest - now))):
                    if key.fileobj is self.listener:
                        self._accept()
                    else:
                        self._read(self.pending[key.fd])
                now = time.monotonic()
                for late in [p for p in self.pending.values() if p.deadline <= now]:
                    self._drop(late, f"no token within {wire.AUTH_SECONDS:.0f} s", BAD_TOKEN)
        finally:
            for left in list(self.pending.values()):
                self._drop(left)
            self.selector.close()
            self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: the others still get served
                log.warning("tcp: cannot accept: %s", exc)
                return
            if len(self.pending) >= MAX_PENDING:
                # The oldest goes: a real client sends its token at once, a squatter trickles.
                self._drop(min(self.pending.values(), key=lambda p: p.deadline))
            conn.setblocking(False)
            waiting = _Pending(conn, time.monotonic() + wire.AUTH_SECONDS)
            self.pending[conn.fileno()] = waiting
            self.selector.register(conn, selectors.EVENT_READ)

    def _read(self, waiting: _Pending) -> None:
        data = waiting.data
        need = 5 + int.from_bytes(data[1:5], "big") if len(data) >= 5 else 5
        try:
            chunk = waiting.conn.recv(
                need - len(data)
            )  # never past the frame: the rest is the worker's
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(waiting)
            return
        data = waiting.data = data + chunk
        if len(data) < 5:
            return
        size = int.from_bytes(data[1:5], "big")
        if data[:1] != wire.TOKEN or size > wire.MAX_TOKEN:
            self._drop(waiting, "bad token", BAD_TOKEN)
            return
        if len(data) < 5 + size:
            return
        if not tokens.matches(data[5:], self.token):
            self._drop(waiting, "bad token", BAD_TOKEN)
            return
        self._forget(waiting)
        try:
            socket.send_fds(self.handoff, [b"c"], [waiting.conn.fileno()])
        except OSError:  # the queue is full (or the daemon is stopping)
            _refuse(waiting.conn, "busy: too many clients waiting, try again", BUSY)
        waiting.conn.close()

    def _forget(self, waiting: _Pending) -> None:
        self.pending.pop(waiting.conn.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(waiting.conn)

    def _drop(self, waiting: _Pending, why: str = "", code: int = 0) -> None:
        self._forget(waiting)
        if why:
            _refuse(waiting.conn, why, code)
        waiting.conn.close()


def _refuse(conn: socket.socket, why: str, code: int) -> None:
    """One line on the client's stderr and its exit code (never blocks: a few bytes, or nothing)."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(
            wire.STDERR
            + _frame(f"hybrid: error: server: {why}\n".encode())
            + wire.EXIT
            + _frame(str(code).encode())
        )


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload
