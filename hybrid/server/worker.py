"""A warm worker process: runs forwarded commands through the CLI's own entry point.

The worker has imported the command modules and loaded the compiled guests once. For each
connection it takes the client's stdin, stdout and stderr as its descriptors 0, 1 and 2, its
working directory and its environment, runs ``hybrid.cli.main(argv)`` (the same code a
process of its own would run) and sends the exit code back; then it puts its own state back.
One command at a time per worker; the daemon starts more workers when all are busy.

Signals: the client forwards SIGINT, SIGTERM and SIGHUP, and a client that disappears counts
as SIGTERM. They are raised in this process's main thread, where the CLI turns them into its
usual cleanup (sandbox stopped, scratch removed) and exit status. A worker whose command was
interrupted answers and then exits (the daemon starts a fresh one): nothing half-cleaned
stays for the next command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from typing import Any

from hybrid.server import gate, wire

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Control:
    """The worker's line to the daemon: JSON lines, replies read by one thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.replies: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self.gone = False
        self.stopping = False
        threading.Thread(target=self._read, name="hybrid-control", daemon=True).start()

    def tell(self, **message: Any) -> None:
        with self.lock, contextlib.suppress(OSError):
            self.sock.sendall(json.dumps(message).encode() + b"\n")

    def ask(self, timeout: float = 30.0, **message: Any) -> dict[str, Any] | None:
        """Send a request and wait for its reply (None if the daemon is gone or slow).

        A reply that came with a descriptor has it as ``fd``; it is the caller's to close."""
        with self.cond:
            self._drop_replies()
        self.tell(**message)
        with self.cond:
            self.cond.wait_for(lambda: self.replies or self.gone, timeout)
            return self.replies.pop(0) if self.replies else None

    def _drop_replies(self) -> None:
        # Replies nobody waits for any more (a timed-out ask): their descriptors go too.
        for stale in self.replies:
            if stale.get("fd") is not None:
                with contextlib.suppress(OSError):
                    os.close(stale["fd"])
        self.replies.clear()

    def _read(self) -> None:
        pending = b""
        fds: list[int] = []
        while True:
            try:
                data, received, _, _ = socket.recv_fds(self.sock, 65536, 4)
            except OSError:
                break
            fds += received  # they come with the first byte of the line they belong to
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                message = json.loads(line)
                if message.get("slot"):
                    message["fd"] = fds.pop(0) if fds else None
                with self.cond:
                    if message.get("op") == "stop":
                        self.stopping = True
                    else:
                        self.replies.append(message)
                    self.cond.notify_all()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        with self.cond:
            self.gone = True
            self.cond.notify_all()


class Worker:
    """Serves connections, one at a time: from the Unix socket (this user's, checked by
    SO_PEERCRED) and from the daemon's queue of TCP connections whose token it has checked."""

    def __init__(
        self, listeners: list[socket.socket], handoff: socket.socket, control: Control
    ) -> None:
        self.listeners = listeners
        self.handoff = handoff
        self.control = control
        self.main_thread = threading.main_thread().ident
        self.lock = threading.Lock()
        self.running = False
        self.job = 0
        self.interrupted = False
        self.home_env = dict(os.environ)
        self.home_cwd = os.getcwd()
        self.home_fds = [os.dup(fd) for fd in (0, 1, 2)]
        for fd in self.home_fds:
            os.set_inheritable(fd, False)
        self.home_streams = (sys.stdin, sys.stdout, sys.stderr)

    def serve(self) -> None:
        selector = selectors.DefaultSelector()
        for listener in (*self.listeners, self.handoff):
            listener.setblocking(False)
            selector.register(listener, selectors.EVENT_READ)
        while not (self.control.gone or self.control.stopping or self.interrupted):
            for key, _ in selector.select(0.5):
                self._accept(key.fileobj)  # type: ignore[arg-type]
                break
        if self.control.stopping and not self.interrupted:
            # The socket is gone already; whoever connected before that is still answered.
            for listener in (*self.listeners, self.handoff):
                while self._accept(listener):
                    pass

    def _accept(self, listener: socket.socket) -> bool:
        relayed = listener is self.handoff
        if relayed:
            conn = gate.take(listener)
            if conn is None:
                return False
        else:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return False  # another worker took it
        with conn:
            self.control.tell(op="busy")
            try:
                # A client that went away or spoke nonsense costs its connection, never the worker.
                with contextlib.suppress(Exception):
                    self.handle(conn, relayed)
            finally:
                self.control.tell(op="idle", retire=self.interrupted)
        return True

    def handle(self, conn: socket.socket, relayed: bool = False) -> None:
        """One connection: a Unix one from this user, or a TCP one the daemon authenticated."""
        conn.setblocking(True)
        if not relayed and wire.peer_uid(conn) != os.getuid():
            return  # another user: not even an answer
        if relayed:
            wire.send(conn, wire.READY)  # a client still waiting sends its header now
        reader = wire.Reader(conn)
        try:
            frame = reader.frame(time.monotonic() + wire.HEADER_SECONDS, limit=wire.MAX_HEADER)
        except (OSError, ValueError):
            frame = None
        conn.settimeout(None)
        if frame is None or frame[0] != wire.HEADER:
            self._close_fds(reader.fds)
            return
        request = _request(frame[1])
        if request is None:
            self._close_fds(reader.fds)
            _refuse(conn, "malformed request", 2)
            return
        op = request.get("op", "run")
        if op != "run":
            self._close_fds(reader.fds)
            if op == "stop":
                self.control.tell(op="stop")
            answer = self.control.ask(op="status") if op == "status" else {}
            reply = {"pid": os.getppid(), **(answer or {})}
            wire.send(conn, wire.REPLY, json.dumps(reply).encode())
            return
        argv = request["argv"]
        if not argv or argv[0] not in wire.FORWARDED:
            self._close_fds(reader.fds)
            _refuse(conn, "not a forwarded command", 2)
            return
        relay = request.get("stdio") == "relay"
        if not relay and len(reader.fds) != 3:
            self._close_fds(reader.fds)
            _refuse(conn, "expected three descriptors", 2)
            return
        wire.send(conn, wire.ACCEPTED)
        code = self.run(conn, reader, argv, request, relay)
        with contextlib.suppress(OSError):
            wire.send(conn, wire.EXIT, str(code).encode())
            conn.shutdown(socket.SHUT_RDWR)  # ends this job's watcher now

    def run(
        self,
        conn: socket.socket,
        reader: wire.Reader,
        argv: list[str],
        request: dict[str, Any],
        relay: bool,
    ) -> int:
        relays: list[threading.Thread] = []
        if relay:
            fds, relays, stdin_w = self._relay_pipes(conn)
        else:
            fds, stdin_w = reader.fds, None
        try:
            os.chdir(request.get("cwd") or "/")
        except OSError as exc:
            self._close_fds(fds)
            message = f"hybrid: error: cannot enter the working directory: {exc.strerror}\n"
            self._write_err(conn, relay, reader, message)
            return 2
        os.environ.clear()
        os.environ.update(request["env"])
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        self._close_fds(fds)
        self._streams()
        watcher = threading.Thread(
            target=self._watch,
            args=(self.job + 1, reader, stdin_w),
            name="hybrid-client",
            daemon=True,
        )
        code = 1
        try:
            self._arm()
            with self.lock:
                self.running = True
                self.job += 1
            watcher.start()
            code = _call_main(argv)
        except BaseException as exc:  # a signal that arrived after the command had finished
            self.interrupted = True
            code = 130
            late: BaseException | None = exc
        else:
            late = None
        finally:
            with self.lock:
                self.running = False
            self._restore()
        if late is not None:
            import traceback

            traceback.print_exception(late)
        for thread in relays:
            thread.join(5)
        return code

    def _arm(self) -> None:
        # The CLI's own handlers: SIGTERM/SIGHUP raise Terminated, SIGINT KeyboardInterrupt.
        from hybrid.cli import _terminate

        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _terminate)
        signal.signal(signal.SIGHUP, _terminate)

    def _watch(self, job: int, reader: wire.Reader, stdin_w: int | None) -> None:
        """Forward the client's signals (and, relayed, its stdin); its disappearance is SIGTERM."""
        while True:
            try:
                frame = reader.frame()
            except (OSError, ValueError):
                frame = None
            if frame is None:
                self._signal(job, signal.SIGTERM)
                return
            kind, payload = frame
            if kind == wire.SIGNAL:
                with contextlib.suppress(ValueError):
                    number = int(payload)
                    if number in SIGNALS:
                        self._signal(job, number)
            elif kind == wire.STDIN and stdin_w is not None:
                if not payload:
                    os.close(stdin_w)
                    stdin_w = None
                    continue
                with contextlib.suppress(OSError):
                    os.write(stdin_w, payload)

    def _signal(self, job: int, number: int) -> None:
        # Only the job this client asked for: a watcher outliving its job must not hit the next.
        with self.lock:
            if self.running and self.job == job and self.main_thread is not None:
                self.interrupted = True
                signal.pthread_kill(self.main_thread, number)

    def _streams(self) -> None:
        home_in, home_out, home_err = self.home_streams
        sys.stdin = io.TextIOWrapper(
            io.BufferedReader(io.FileIO(0, "rb", closefd=False)),
            encoding=home_in.encoding,
            errors=home_in.errors,
        )
        sys.stdout = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(1, "wb", closefd=False)),
            encoding=home_out.encoding,
            errors=home_out.errors,
            line_buffering=os.isatty(1),
        )
        sys.stderr = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(2, "wb", closefd=False)),
            encoding=home_err.encoding,
            errors="backslashreplace",
            line_buffering=True,
        )

    def _restore(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdin, sys.stdout, sys.stderr = self.home_streams
        for target, fd in enumerate(self.home_fds):
            os.dup2(fd, target)  # the client's descriptors are released here
        os.environ.clear()
        os.environ.update(self.home_env)
        with contextlib.suppress(OSError):
            os.chdir(self.home_cwd)

    def _relay_pipes(self, conn: socket.socket) -> tuple[list[int], list[threading.Thread], int]:
        """Pipes standing for the client's streams over TCP: (fds for 0/1/2, pumps, stdin's writer)."""
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        lock = threading.Lock()

        def pump(fd: int, kind: bytes) -> None:
            with contextlib.suppress(OSError):
                while chunk := os.read(fd, 65536):
                    with lock:
                        wire.send(conn, kind, chunk)
            os.close(fd)

        pumps = [
            threading.Thread(target=pump, args=(out_r, wire.STDOUT), daemon=True),
            threading.Thread(target=pump, args=(err_r, wire.STDERR), daemon=True),
        ]
        for thread in pumps:
            thread.start()
        return [stdin_r, out_w, err_w], pumps, stdin_w

    def _write_err(
        self, conn: socket.socket, relay: bool, reader: wire.Reader, message: str
    ) -> None:
        with contextlib.suppress(OSError):
            wire.send(conn, wire.STDERR, message.encode())

    @staticmethod
    def _close_fds(fds: list[int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _request(payload: bytes) -> dict[str, Any] | None:
    """The header as a request, or None when it is not one (bad JSON, nesting too deep for the
    parser, fields of the wrong type): a peer's nonsense must never end the worker."""
    try:
        request = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(request, dict) or not isinstance(request.get("op", "run"), str):
        return None
    argv, env = request.get("argv", []), request.get("env") or {}
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return None
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        return None
    if not isinstance(request.get("cwd") or "", str):
        return None
    return {**request, "argv": argv, "env": env}


def _refuse(conn: socket.socket, why: str, code: int) -> None:
    wire.send(conn, wire.STDERR, f"hybrid: error: server: {why}\n".encode())
    wire.send(conn, wire.EXIT, str(code).encode())


def _call_main(argv: list[str]) -> int:
    from hybrid.cli import main

    try:
        main(argv)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    return 0


def warm() -> None:
    """Load what forwarded commands use, so the first one is as fast as the rest."""
    import importlib

    from hybrid.cli import COMMANDS
    from hybrid.cli._output import log_to_stderr

    log_to_stderr()
    for name in wire.FORWARDED:
        importlib.import_module(COMMANDS[name][0])
    with contextlib.suppress(Exception):  # a host without a tier still serves the others
        from hybrid.wasm.python import run_python

        run_python("pass")
    with contextlib.suppress(Exception):
        from hybrid.checks import check_csv

        check_csv("a,b\n1,2\n")
    with contextlib.suppress(Exception):
        import hybrid.context.tags
        import hybrid.workstation.docker  # noqa: F401  (the Docker SDK)
    threading.Thread(target=_keep_availability, name="hybrid-availability", daemon=True).start()


AVAILABILITY_SECONDS = 5.0
"""How old the worker's view of which tiers this host runs may get (``hybrid.router``)."""


def _keep_availability() -> None:
    # A process of its own probes the tiers once; a worker lives on, so it probes again in the
    # background (an engine started or stopped, an image built) and no command waits for it.
    from hybrid import router

    while True:
        with contextlib.suppress(Exception):
            router.availability(refresh=True)
        time.sleep(AVAILABILITY_SECONDS)


def main() -> None:
    parser = argparse.ArgumentParser(prog="hybrid-server-worker")
    parser.add_argument("--listen-fd", type=int, action="append", default=[])
    parser.add_argument("--handoff-fd", type=int, required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    args = parser.parse_args()
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    control = Control(socket.socket(fileno=args.control_fd))
    listeners = [socket.socket(fileno=fd) for fd in args.listen_fd]
    handoff = socket.socket(fileno=args.handoff_fd)
    started = time.monotonic()
    from hybrid.cli import Terminated, _terminate

    # The daemon ends a worker that is still warming up with SIGTERM: unwind (its guest build
    # and the process building it stop, their files go) instead of dying on the spot.
    signal.signal(signal.SIGTERM, _terminate)
    try:
        warm()
    except Terminated:
        return
    from hybrid.server import pool

    pool.connect(control)
    control.tell(op="ready", warm_ms=round((time.monotonic() - started) * 1000, 1))
    worker = Worker(listeners, handoff, control)
    # KeyboardInterrupt: the daemon's SIGTERM between commands (hybrid.cli.Terminated).
    with contextlib.suppress(KeyboardInterrupt):
        worker.serve()


if __name__ == "__main__":
    main()
