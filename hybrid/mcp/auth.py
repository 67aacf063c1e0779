"""Who may talk to ``hybrid mcp`` over HTTP: the holder of the user's token, or the user himself.

The tools read the roots, start workstations and spend the model budget of the user who started
the server, so no other local user may call them. Over TCP every request must carry
``Authorization: Bearer <token>``, the token being the content of ``token_path()`` (0600 in the
user's 0700 runtime directory); it is checked, in constant time, before the request reaches the
SDK. Over a Unix socket (``--unix-socket``) the socket file is 0600 and every connection's peer
uid (SO_PEERCRED) must be the server's: no token needed.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from hybrid import paths, tokens

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

HEADER = "Authorization"
"""The header a client sends: ``Authorization: Bearer <token>``."""


def token_path() -> Path:
    """The MCP HTTP token of this user (made on first use, kept across restarts so a client's
    configuration stays valid)."""
    return paths.runtime_dir() / "mcp.token"


class BearerAuth:
    """ASGI middleware: every HTTP request needs the bearer token, or it gets a 401."""

    def __init__(self, app: App, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or self._carries_token(scope):
            await self.app(scope, receive, send)  # lifespan events come from uvicorn, not a peer
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
            return
        body = json.dumps(
            {
                "error": "unauthorized",
                "message": f"send the header '{HEADER}: Bearer <token>' (the token is in the "
                "file `hybrid mcp` printed when it started)",
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="hybrid mcp"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _carries_token(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", []):
            if name.lower() == b"authorization":
                scheme, _, given = bytes(value).partition(b" ")
                return scheme.lower() == b"bearer" and tokens.matches(given.strip(), self.token)
        return False


def unix_listener(path: Path) -> socket.socket:
    """A listening Unix socket at ``path`` that only this user can connect to (mode 0600)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if path.is_socket():
        path.unlink()  # a server that died left it; a live one would hold its port, not a file
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


def peer_is_owner(transport: Any) -> bool:
    """Whether a connection's peer is this user (always true off a Unix socket)."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return True
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)  # struct ucred
    return int.from_bytes(creds[4:8], sys.byteorder, signed=True) == os.getuid()


def owner_only_protocol() -> type:
    """uvicorn's HTTP protocol, closing every connection whose peer is another user."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class OwnerOnly(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if not peer_is_owner(transport):
                transport.close()  # before a byte of the request is read

    return OwnerOnly
