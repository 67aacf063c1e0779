"""The ``hybrid`` console entry: forward a command to the resident server, or run it here.

This module imports only ``hybrid.server.wire`` and C modules of the standard library (``_socket``
and ``_signal``, not the ``socket`` and ``signal`` wrappers, which load ``enum``), so a forwarded
command costs an interpreter start and one socket round trip. Commands in
``wire.FORWARDED`` go to the server for this configuration (see wire.py) with the client's
argv, working directory, environment and its stdin/stdout/stderr descriptors; the server runs
the same Click entry point on them. Every other command, ``--no-server`` as the first argument,
``HYBRID_NO_SERVER=1``, or a server that cannot be reached runs the command in this process
(``hybrid.cli.main``); in the last case a server is started in the background once the command
is done, for next time.

``HYBRID_SERVER_URL=tcp://HOST:PORT`` with ``HYBRID_SERVER_TOKEN`` reaches a server started
with ``hybrid serve --tcp``: the streams are relayed in frames instead. Such a client waits at
most ``HYBRID_SERVER_TIMEOUT`` seconds (default ``TIMEOUT``) for a worker to take it, then runs
the command here.
"""

from __future__ import annotations

import _signal
import _socket
import gc
import os
import sys

from hybrid.server import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NO_SERVER_FLAG = "--no-server"
TIMEOUT = 30.0
"""Seconds to connect, and over TCP to be taken by a worker (``HYBRID_SERVER_TIMEOUT``)."""
_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)


def main() -> None:
    """Console entry point (``hybrid``)."""
    argv = sys.argv[1:]
    local = False
    if argv[:1] == [NO_SERVER_FLAG]:
        argv, local = argv[1:], True
    if os.environ.get("HYBRID_NO_SERVER", "") not in ("", "0"):
        local = True
    start_after = False
    if not local and argv[:1] and argv[0] in wire.FORWARDED:
        code = forward(argv)
        if code is not None:
            sys.exit(code)
        start_after = not os.environ.get("HYBRID_SERVER_URL")
    if sys.flags.no_site:  # a launcher that skipped site for speed: the full CLI needs it
        import site

        site.main()
    from hybrid.cli import main as in_process

    try:
        in_process(argv)
    finally:
        # After this command, not beside it: a server warming up (imports, compiled guests) would
        # take the cores this run is using (a cold `map` of sympy took 13.5 s instead of 5.8 s).
        if start_after and not isinstance(sys.exc_info()[1], KeyboardInterrupt):
            start_server()
        # The process ends next: as in hybrid.cli.main, the collector's last passes would walk
        # every object the command made to free what exiting frees anyway.
        gc.freeze()


def forward(argv: list[str]) -> int | None:
    """Run ``argv`` on the server; its exit code, or None when no server answers."""
    url = os.environ.get("HYBRID_SERVER_URL", "")
    try:
        cwd = os.getcwd()
        sock = _tcp(url) if url else _connect()
    except (OSError, ValueError):
        return None
    try:
        request: dict[str, Any] = {"op": "run", "argv": argv, "cwd": cwd, "env": dict(os.environ)}
        reader = wire.Reader(sock)
        try:
            if url:
                refused = _admitted(sock, reader, url)
                if refused is not None:
                    return refused
                request["stdio"] = "relay"
                wire.send_json(sock, wire.HEADER, request)
            else:
                fds = _stdio()
                wire.send_json(sock, wire.HEADER, request, fds)
                for fd in fds:
                    if fd > 2:
                        os.close(fd)
            sock.settimeout(None)
        except OSError:
            return None  # the server went away before it took the command: run it here
        previous = _forward_signals(sock)
        if url:
            import threading

            threading.Thread(target=_pump_stdin, args=(sock,), daemon=True).start()
        try:
            return _wait(sock, reader)
        finally:
            for signum, handler in previous.items():
                _signal.signal(signum, handler)
    finally:
        sock.close()


def _timeout() -> float:
    try:
        return float(os.environ.get("HYBRID_SERVER_TIMEOUT") or TIMEOUT)
    except ValueError:
        return TIMEOUT


def _admitted(sock: _socket.socket, reader: wire.Reader, url: str) -> int | None:
    """Over TCP: send the token and wait until a worker takes the connection (None), or the
    server's refusal (its exit code). A timeout is an OSError: the command runs here, and as the
    header was never sent, nothing runs on the server."""
    wire.send(sock, wire.TOKEN, os.environ.get("HYBRID_SERVER_TOKEN", "").encode())
    while True:
        try:
            frame = reader.frame()
        except TimeoutError:
            sys.stderr.write(
                f"hybrid: the server at {url} did not take the command within "
                f"{_timeout():.0f} s: running it here\n"
            )
            raise
        if frame is None:
            raise ConnectionError("the server closed the connection")
        kind, payload = frame
        if kind == wire.READY:
            return None
        if kind == wire.STDERR:
            _write(2, payload)
        elif kind == wire.EXIT:
            return int(payload)


def _connect(path: str | None = None) -> _socket.socket:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(_timeout())
        sock.connect(wire.address(path or wire.socket_path()))
    except BaseException:
        sock.close()
        raise
    return sock


def _stdio() -> list[int]:
    # A closed descriptor (`hybrid ... <&-`) goes as /dev/null, as a new process would see it.
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _forward_signals(sock: _socket.socket) -> dict[int, Any]:
    def send(signum: int, frame: object) -> None:
        # Not contextlib.suppress: importing contextlib costs the client's start-up.
        try:  # noqa: SIM105
            wire.send_json(sock, wire.SIGNAL, signum)
        except OSError:
            pass  # the server is gone; the client ends with the connection

    previous: dict[int, Any] = {}
    for signum in _SIGNALS:
        current = _signal.getsignal(signum)
        if current == _signal.SIG_IGN:
            continue  # nohup: an ignored SIGHUP stays ignored
        previous[signum] = current
        _signal.signal(signum, send)
    return previous


def _wait(sock: _socket.socket, reader: wire.Reader) -> int | None:
    accepted = False
    while True:
        try:
            frame = reader.frame()
        except (OSError, ValueError):
            frame = None
        if frame is None:
            if not accepted:
                return None  # a server going away before it took the command: run it here
            sys.stderr.write("hybrid: error: the server closed the connection before the end\n")
            return 1
        kind, payload = frame
        if kind == wire.ACCEPTED:
            accepted = True
        elif kind == wire.STDOUT:
            _write(1, payload)
        elif kind == wire.STDERR:
            _write(2, payload)
        elif kind == wire.EXIT:
            return int(payload)


def _write(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except BrokenPipeError:
        pass


def _tcp(url: str) -> _socket.socket:
    import socket

    if not url.startswith("tcp://"):
        raise ValueError(f"HYBRID_SERVER_URL must be tcp://HOST:PORT, got {url!r}")
    host, _, port = url.removeprefix("tcp://").rpartition(":")
    return socket.create_connection((host.strip("[]"), int(port)), timeout=_timeout())


def _pump_stdin(sock: _socket.socket) -> None:
    import contextlib

    with contextlib.suppress(OSError):
        sock.settimeout(None)
        while chunk := os.read(0, 65536):
            wire.send(sock, wire.STDIN, chunk)
        wire.send(sock, wire.STDIN, b"")


def ask(op: str) -> dict[str, Any] | None:
    """Send ``op`` (status, stop) to this configuration's server; its answer, or None.

    It goes to the daemon's control socket: a server whose workers are all busy still answers."""
    try:
        sock = _connect(wire.control_path(wire.socket_path()))
    except (OSError, ValueError):
        return None
    try:
        sock.settimeout(30)
        wire.send_json(sock, wire.HEADER, {"op": op})
        frame = wire.Reader(sock).frame()
    except (OSError, ValueError):
        return None
    finally:
        sock.close()
    if frame is None or frame[0] != wire.REPLY:
        return None
    import json

    answer: dict[str, Any] = json.loads(frame[1])
    return answer


def start_server(*options: str) -> None:
    """Start a server for this configuration in the background (it outlives this process)."""
    import subprocess

    try:
        log = open(wire.socket_path().removesuffix(".sock") + ".log", "ab")  # noqa: SIM115  (handed to the child)
    except OSError:
        return
    with log:
        subprocess.Popen(
            [sys.executable, "-P", "-m", "hybrid", "serve", "--quiet", *options],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd="/",
            start_new_session=True,
        )
