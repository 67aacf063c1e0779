"""What client and server agree on: where the socket is, and the frames on it (stdlib only).

A frame is one type byte, a 4-byte big-endian length and the payload. A request starts with a
``H`` frame (JSON: op, argv, cwd, env) that carries the client's stdin, stdout and stderr as
SCM_RIGHTS descriptors on a Unix socket, so the command writes straight to them (a terminal
stays a terminal, output streams, a pipe's reader sees EOF when the command ends). Over TCP no
descriptor can travel: the header says ``relay`` and the streams go as ``I``/``O``/``E``
frames (an empty ``I`` frame is stdin's EOF), and before anything else the client sends a ``T``
frame with the server's token: the daemon checks it (within ``AUTH_SECONDS`` for the whole
frame) before the connection reaches a worker, and the worker that takes it says ``W`` before
the client sends its header (a client that gave up waiting has closed the connection by then,
so nothing runs twice). The server answers ``A`` when it takes the
command (a connection closed before that never ran anything, so the client may run it
itself), the client may send ``S`` (a signal number) at any time, and the server ends with
``X`` (the exit code, in decimal) or, for ``status`` and ``stop``, ``R`` (JSON). ``status``
and ``stop`` go to the daemon's own control socket (``control_path``), which no busy worker holds.

The client's side imports no json, hashlib, re, enum, struct, or even ``socket`` and ``signal``
(both load ``enum``: 11 ms of a 60 ms command on a slow host): its start-up is most of a warm
command's cost, so it uses the C modules ``_socket`` and ``_signal`` underneath them.

One server serves one configuration: the socket's name is a hash of what decides how the
toolkit behaves (interpreter, import path, ``HYBRID_*``, XDG and Docker variables), so a
client with another state directory or another checkout never reaches a server that would
answer differently.
"""

from __future__ import annotations

import _socket
import os
import sys
from time import monotonic

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FORWARDED = ("run", "check", "py", "map", "context", "skeleton")
"""Commands a client sends to the server (every other command runs in the client's process)."""

HEADER, ACCEPTED, STDIN, STDOUT, STDERR, SIGNAL, EXIT, REPLY, TOKEN, READY = (
    b"H",
    b"A",
    b"I",
    b"O",
    b"E",
    b"S",
    b"X",
    b"R",
    b"T",
    b"W",
)
MAX_FRAME = 64 * 1024**2
"""The largest frame either side accepts."""

MAX_HEADER = 4 * 1024**2
"""The largest request header (argv and environment: Linux caps both together at 2 MiB)."""

MAX_TOKEN = 256
"""The largest token frame's payload."""

HEADER_SECONDS = 10.0
"""Seconds a connection has to send its whole header (not per byte: a trickle is cut off)."""

AUTH_SECONDS = 5.0
"""Seconds a TCP connection has to send its whole token frame."""

NOT_CONFIG = frozenset({"HYBRID_NO_SERVER", "HYBRID_SERVER_URL", "HYBRID_SERVER_TOKEN"})
"""HYBRID_* variables that choose how a command reaches the server, not what it does."""

CONFIG_VARS = (
    "PYTHONPATH",
    "HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "TMPDIR",
)
"""Variables besides HYBRID_* that change what a warm server would do."""

_SUN_PATH = 100  # sockaddr_un holds 108 bytes; keep a margin


def config_key() -> str:
    """A short hash of the configuration a server is started with (see the module docstring)."""
    env = os.environ
    parts = [sys.executable, str(os.getuid())]
    parts += [f"{k}={env[k]}" for k in CONFIG_VARS if k in env]
    parts += sorted(
        f"{k}={v}" for k, v in env.items() if k.startswith("HYBRID_") and k not in NOT_CONFIG
    )
    # FNV-1a, 64 bits: a name, not a secret (and hashlib would cost the client ~2 ms to load).
    value = 0xCBF29CE484222325
    for byte in "\0".join(parts).encode("utf-8", "surrogateescape"):
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


def runtime_path() -> str:
    """``hybrid.paths.runtime_dir`` as a string, with no import beyond ``os``: the client pays
    for every module it loads. The state root fallback is ``hybrid.paths.state_root``'s."""
    env = os.environ
    if env.get("HYBRID_RUNTIME_DIR"):
        path = env["HYBRID_RUNTIME_DIR"]
    elif env.get("XDG_RUNTIME_DIR"):
        path = os.path.join(env["XDG_RUNTIME_DIR"], "hybrid")
    elif env.get("HYBRID_STATE_DIR"):
        path = os.path.join(env["HYBRID_STATE_DIR"], "run")
    elif env.get("XDG_STATE_HOME"):
        path = os.path.join(env["XDG_STATE_HOME"], "hybrid", "run")
    else:
        path = os.path.join(os.path.expanduser("~"), ".local", "state", "hybrid", "run")
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if info.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to uid {info.st_uid}, not to this user")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def socket_path() -> str:
    """The Unix socket of the server for this process's configuration."""
    return os.path.join(runtime_path(), f"serve-{config_key()}.sock")


def control_path(path: str) -> str:
    """The daemon's control socket (status, stop) beside the server's socket ``path``."""
    return path.removesuffix(".sock") + ".ctl"


def address(path: str) -> str:
    """A connectable address for ``path``, even past sockaddr_un's length (through /proc)."""
    if len(path.encode()) <= _SUN_PATH:
        return path
    # A directory descriptor opened for this process: /proc/self/fd/N/name is short.
    fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    _LONG_PATH_FDS.append(fd)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}"


_LONG_PATH_FDS: list[int] = []

_RIGHTS_SPACE = _socket.CMSG_SPACE(8 * 4)
"""Ancillary room for up to 8 descriptors with one frame (a request carries 3)."""


def send(
    sock: _socket.socket,
    kind: bytes,
    payload: bytes = b"",
    fds: list[int] | None = None,
) -> None:
    """Send one frame (with ``fds`` as SCM_RIGHTS on a Unix socket)."""
    data = kind + len(payload).to_bytes(4, "big") + payload
    if fds:
        rights = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)
        sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        if sent < len(data):
            sock.sendall(data[sent:])
    else:
        sock.sendall(data)


def send_json(sock: _socket.socket, kind: bytes, value: Any, fds: list[int] | None = None) -> None:
    """Send one frame whose payload is ``value`` (str, int, bool, None, lists, dicts) as JSON."""
    send(sock, kind, dumps(value).encode("utf-8", "surrogatepass"), fds)


_ESCAPES = {i: f"\\u{i:04x}" for i in range(0x20)} | {ord('"'): '\\"', ord("\\"): "\\\\"}


def dumps(value: Any) -> str:
    """``value`` as JSON; lone surrogates (undecodable bytes in argv or the environment, as
    Python holds them) become ``\\udcXX`` escapes that ``json.loads`` turns back into the same."""
    if isinstance(value, str):
        text = value.translate(_ESCAPES)
        if not text.isascii():
            text = "".join(f"\\u{ord(c):04x}" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
        return f'"{text}"'
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{dumps(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot send a {type(value).__name__}")


class Reader:
    """Reads frames from a socket, collecting descriptors that arrive with them."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.fds: list[int] = []

    def _fill(self, need: int, deadline: float | None) -> bool:
        while len(self.buffer) < need:
            if deadline is not None:
                left = deadline - monotonic()
                if left <= 0:
                    raise TimeoutError("the peer was too slow")
                self.sock.settimeout(left)
            if self.sock.family == _socket.AF_UNIX:
                data, ancillary, _flags, _address = self.sock.recvmsg(
                    65536, _RIGHTS_SPACE, _socket.MSG_CMSG_CLOEXEC
                )
                for level, kind, rights in ancillary:
                    if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                        whole = len(rights) - len(rights) % 4  # a truncated one is no descriptor
                        self.fds += [
                            int.from_bytes(rights[i : i + 4], sys.byteorder, signed=True)
                            for i in range(0, whole, 4)
                        ]
            else:
                data = self.sock.recv(65536)
            if not data:
                return False
            self.buffer += data
        return True

    def frame(
        self, deadline: float | None = None, limit: int = MAX_FRAME
    ) -> tuple[bytes, bytes] | None:
        """The next (type, payload), or None at end of stream.

        With ``deadline`` (a ``time.monotonic`` value) the whole frame must arrive by then
        (TimeoutError otherwise, and the socket keeps a timeout: the caller resets it); a frame
        longer than ``limit`` is a ValueError before its payload is read."""
        if not self._fill(5, deadline):
            return None
        kind, size = self.buffer[:1], int.from_bytes(self.buffer[1:5], "big")
        if size > limit:
            raise ValueError(f"frame of {size} bytes")
        if not self._fill(5 + size, deadline):
            return None
        payload = self.buffer[5 : 5 + size]
        self.buffer = self.buffer[5 + size :]
        return kind, payload


def peer_uid(sock: _socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # struct ucred: 3 ints
    return int.from_bytes(creds[4:8], sys.byteorder, signed=True)
