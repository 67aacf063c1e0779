"""The server process: one socket, warm worker processes, a sandbox pool, an idle deadline.

Workers (worker.py) accept connections on the shared listening socket themselves, so a
command costs no hop through this process; this process starts them, starts more while all
are busy (up to ``max_workers``), replaces any that exits, answers their pool requests and
ends everything after ``idle_seconds`` without a command, on SIGTERM/SIGINT, on ``hybrid serve
--stop``, or when the toolkit's files change under it (so a server never answers with old code).

Only one server runs per socket: it holds an exclusive lock on ``<socket>.lock`` for its whole
life. A socket file without that lock is stale (a server was killed) and is replaced.

``status`` and ``stop`` come to this process's own control socket (``<socket>.ctl``, same user
only), so they are answered while every worker is busy. With ``--tcp`` this process also owns
the TCP listener: ``gate.Gate`` checks each connection's token before any worker sees it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from collections.abc import Sequence

    from hybrid.server.pool import SandboxPool

from hybrid import tokens
from hybrid.server import gate, wire

log = logging.getLogger(__name__)


class ServeConfig(BaseModel):
    """How ``hybrid serve`` runs."""

    model_config = ConfigDict(extra="forbid")

    idle_seconds: float = Field(600.0, gt=0)
    """Exit after this long without a command."""
    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    """Warm workers started at once."""
    max_workers: int = Field(default_factory=lambda: min(16, 4 * (os.cpu_count() or 1)), ge=1)
    """The most workers at a time (more start while all are busy)."""
    pool_size: int = Field(1, ge=0)
    """Ready sandboxes per (tier, image, spec) that jobs use; 0 turns the pool off."""
    pool_idle_seconds: float = Field(300.0, gt=0)
    """A pool key (and a ready sandbox) unused this long is dropped."""
    pool_warm: list[str] = []
    """Container tiers whose default spec is pooled from the start (e.g. docker, gvisor)."""
    tcp: str | None = None
    """HOST:PORT to listen on besides the Unix socket (clients must send the token)."""


CONTROL_SECONDS = 10.0
"""Seconds a control connection (status, stop) has for its request."""


def fingerprint() -> tuple[tuple[str, int, int], ...]:
    """The toolkit's source files as (path, mtime, size): a change means new code."""
    root = Path(__file__).resolve().parent.parent
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                with contextlib.suppress(OSError):
                    info = os.stat(os.path.join(folder, name))
                    found.append((os.path.join(folder, name), info.st_mtime_ns, info.st_size))
    return tuple(sorted(found))


class _WorkerHandle:
    def __init__(self, process: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.process = process
        self.control = control
        self.ready = False
        self.busy = False
        self.retire = False
        self.lock = threading.Lock()

    def send(self, fds: Sequence[int] = (), **message: Any) -> None:
        """One JSON line to the worker; ``fds`` go along with its first byte."""
        data = json.dumps(message).encode() + b"\n"
        with self.lock, contextlib.suppress(OSError):
            if fds:
                socket.send_fds(self.control, [data[:1]], list(fds))
                data = data[1:]
            self.control.sendall(data)


class Daemon:
    """One running server (see the module docstring)."""

    def __init__(self, config: ServeConfig, path: Path) -> None:
        self.config = config
        self.path = path
        self.workers: list[_WorkerHandle] = []
        self.lock = threading.Lock()
        self.last_active = time.monotonic()
        self.stopping = threading.Event()
        self.listeners: list[socket.socket] = []  # what workers accept on
        self.control: socket.socket | None = None
        self.handoff, self.queue = gate.queue()
        self.gate: gate.Gate | None = None
        self.pool: SandboxPool | None = None
        self.code = fingerprint()
        self.started = time.time()
        self.commands = 0
        self.tcp_address: str | None = None
        self.token_file: Path | None = None

    # -- life ------------------------------------------------------------------------------

    def run(self) -> None:
        self._listen()
        if self.config.pool_size > 0:
            from hybrid.server.pool import SandboxPool

            self.pool = SandboxPool(self.config.pool_size, self.config.pool_idle_seconds)
            for tier in self.config.pool_warm:
                self._warm_tier(tier)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda *_: self.stopping.set())
        for _ in range(self.config.workers):
            self._spawn()
        try:
            while not self.stopping.wait(0.5):
                self._tend()
        finally:
            self._shutdown()

    def _listen(self) -> None:
        self.listeners.append(self._unix(self.path))
        self.control = self._unix(Path(wire.control_path(str(self.path))))
        threading.Thread(target=self._answer_control, name="hybrid-control", daemon=True).start()
        if self.config.tcp:
            host, _, port = self.config.tcp.rpartition(":")
            tcp = socket.create_server((host or "127.0.0.1", int(port)), backlog=128)
            self.token_file = self.path.with_suffix(".token")
            token = tokens.issue(self.token_file)
            self.gate = gate.Gate(tcp, token, self.handoff)
            self.gate.start()
            bound = tcp.getsockname()
            self.tcp_address = f"{bound[0]}:{bound[1]}"
            log.warning(
                "listening on tcp %s (clients set HYBRID_SERVER_URL=tcp://%s and "
                "HYBRID_SERVER_TOKEN to the token in %s)",
                self.tcp_address,
                self.tcp_address,
                self.token_file,
            )

    @staticmethod
    def _unix(path: Path) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # stale: we hold the lock, so no server owns it
        old = os.umask(0o177)
        try:
            sock.bind(wire.address(str(path)))
        finally:
            os.umask(old)
        sock.listen(128)
        return sock

    def _answer_control(self) -> None:
        """status and stop, from this user only, on this process's own socket."""
        assert self.control is not None
        while True:
            try:
                conn, _ = self.control.accept()
            except OSError:
                return  # closed at shutdown
            threading.Thread(
                target=self._control_request,
                args=(conn,),
                name="hybrid-control-request",
                daemon=True,
            ).start()

    def _control_request(self, conn: socket.socket) -> None:
        with conn:
            if wire.peer_uid(conn) != os.getuid():
                return  # another user: not even an answer
            reader = wire.Reader(conn)
            try:
                frame = reader.frame(time.monotonic() + CONTROL_SECONDS, limit=64 * 1024)
                request = json.loads(frame[1]) if frame and frame[0] == wire.HEADER else None
            except (OSError, ValueError, RecursionError):
                request = None
            finally:
                for fd in reader.fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            op = request.get("op") if isinstance(request, dict) else None
            if op not in ("status", "stop"):
                return
            answer = self.status()
            if op == "stop":
                self.stopping.set()
            with contextlib.suppress(OSError):
                conn.settimeout(CONTROL_SECONDS)
                wire.send(conn, wire.REPLY, json.dumps(answer).encode())

    def _warm_tier(self, tier: str) -> None:
        from hybrid.policy import SandboxSpec
        from hybrid.server.pool import key_of

        assert self.pool is not None
        self.pool.want(key_of(tier, None, SandboxSpec(tier=tier)))

    def _spawn(self) -> None:
        parent, child = socket.socketpair()
        fds = [child.fileno(), self.queue.fileno(), *(s.fileno() for s in self.listeners)]
        argv = [sys.executable, "-P", "-m", "hybrid.server.worker", "--control-fd", str(fds[0])]
        argv += ["--handoff-fd", str(fds[1])]
        for fd in fds[2:]:
            argv += ["--listen-fd", str(fd)]
        process = subprocess.Popen(argv, pass_fds=fds, stdin=subprocess.DEVNULL, cwd="/")
        child.close()
        handle = _WorkerHandle(process, parent)
        with self.lock:
            self.workers.append(handle)
        threading.Thread(
            target=self._listen_to, args=(handle,), name="hybrid-worker-control", daemon=True
        ).start()

    def _listen_to(self, handle: _WorkerHandle) -> None:
        for line in handle.control.makefile("rb"):
            try:
                message = json.loads(line)
            except ValueError:
                continue
            op = message.get("op")
            if op == "ready":
                handle.ready = True
                self.last_active = time.monotonic()  # the idle clock starts once it can serve
                log.info("worker %s ready in %s ms", handle.process.pid, message.get("warm_ms"))
            elif op == "busy":
                with self.lock:
                    handle.busy = True
                    self.last_active = time.monotonic()
                    self.commands += 1
                self._grow()
            elif op == "idle":
                with self.lock:
                    handle.busy = False
                    handle.retire = bool(message.get("retire"))
                    self.last_active = time.monotonic()
            elif op == "acquire":
                found = self.pool.acquire(message["key"]) if self.pool is not None else None
                slot = found.slot if found is not None else None
                handle.send(
                    fds=[slot.sock.fileno()] if slot is not None else [],
                    id=found and found.id,
                    attrs=found and found.attrs,
                    slot=slot and slot.exec_id,
                )
                if slot is not None:
                    slot.close()  # the worker holds it now
            elif op == "release" and self.pool is not None:
                self.pool.release(str(message["id"]))
            elif op == "status":
                handle.send(**self.status())
            elif op == "stop":
                self.stopping.set()

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {
                "pid": os.getpid(),
                "socket": str(self.path),
                "uptime_s": round(time.time() - self.started, 1),
                "commands": self.commands,
                "workers": len(self.workers),
                "ready": sum(w.ready for w in self.workers),
                "busy": sum(w.busy for w in self.workers),
                "idle_seconds": self.config.idle_seconds,
                "tcp": self.tcp_address,
                "token_file": str(self.token_file) if self.token_file else None,
                "pool": self.pool.stats() if self.pool is not None else None,
            }

    def _grow(self) -> None:
        with self.lock:
            alive = [w for w in self.workers if w.process.poll() is None]
            spare = [w for w in alive if not w.busy]
            grow = not spare and len(alive) < self.config.max_workers
        if grow:
            self._spawn()

    def _tend(self) -> None:
        with self.lock:
            dead = [w for w in self.workers if w.process.poll() is not None]
            for handle in dead:
                self.workers.remove(handle)
                handle.control.close()
            busy = any(w.busy for w in self.workers)
            idle_for = time.monotonic() - self.last_active
            missing = self.config.workers - len(self.workers)
        for _ in range(max(0, missing)):
            self._spawn()
        if not busy and idle_for >= self.config.idle_seconds:
            log.info("idle for %.0f s: exiting", idle_for)
            self.stopping.set()
        elif fingerprint() != self.code:
            log.info("the toolkit's files changed: exiting")
            self.stopping.set()

    def _shutdown(self) -> None:
        # New clients find no socket (and start a new server); queued ones are still served.
        for made in (self.path, Path(wire.control_path(str(self.path))), self.token_file):
            if made is not None:
                with contextlib.suppress(FileNotFoundError):
                    made.unlink()
        if self.gate is not None:
            self.gate.close()
        if self.control is not None:
            with contextlib.suppress(OSError):
                self.control.shutdown(socket.SHUT_RDWR)  # ends the accept in _answer_control
            self.control.close()
        with self.lock:
            workers = list(self.workers)
        for handle in workers:
            handle.send(op="stop")
            if not handle.ready:
                # Still warming up (a guest build can take minutes on a busy host): it serves
                # nobody, so it ends now, cleaning up as a command interrupted by SIGTERM does.
                handle.process.terminate()
        deadline = time.monotonic() + 30
        for handle in workers:
            try:
                handle.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                handle.process.kill()
                handle.process.wait()
        for listener in self.listeners:
            listener.close()
        self.handoff.close()
        self.queue.close()
        if self.pool is not None:
            self.pool.close()


def serve(config: ServeConfig, ready: threading.Event | None = None) -> int:
    """Run a server for this process's configuration until it stops; 0, or 1 if one already runs."""
    path = Path(wire.socket_path())
    lock_fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        return 1
    try:
        Daemon(config, path).run()
    finally:
        os.close(lock_fd)
    return 0
