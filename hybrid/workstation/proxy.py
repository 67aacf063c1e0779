"""The allow-list egress proxy a workstation with ``network.mode = "egress"`` talks through.

This file runs *inside* a separate hardened container (stdlib only): it is the one machine on
the workstation's internal network that also has a route out, and it forwards plain HTTP and
HTTPS ``CONNECT`` requests only to ``host[:port]`` patterns on the allow-list (fnmatch, port
defaults to 80/443). Everything else gets a 403. The workstation itself has no route at all, so
a program that ignores HTTP(S)_PROXY reaches nothing.
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import json
import os
import socket
import sys
from urllib.parse import urlsplit

PORT = 3128
_LIMIT = 64 * 1024
_FORBIDDEN = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def allowed(host: str, port: int, patterns: list[str]) -> bool:
    """Whether ``host:port`` matches one of the allow-list patterns."""
    host = host.lower().rstrip(".")
    for pattern in patterns:
        name, _, want = pattern.lower().partition(":")
        if fnmatch.fnmatchcase(host, name) and (not want or want == "*" or want == str(port)):
            return True
    return False


async def _resolve(host: str, port: int) -> str | None:
    """The address to connect to; None when the name points at this machine or the link (cloud
    metadata at 169.254.169.254, loopback), which no pattern may reach."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    for *_, sockaddr in infos:
        ip = ipaddress.ip_address(sockaddr[0])
        if ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast:
            return None
    return str(infos[0][4][0])


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_LIMIT):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, allow: list[str]
) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
        writer.close()
        return
    request_line, _, rest = head.partition(b"\r\n")
    try:
        method, target, version = request_line.decode("latin-1").split(" ", 2)
    except ValueError:
        writer.close()
        return
    if method.upper() == "CONNECT":
        host, _, port_text = target.rpartition(":")
        port = int(port_text) if port_text.isdigit() else 443
    else:
        url = urlsplit(target)
        host, port = url.hostname or "", url.port or 80
    if not host or not allowed(host, port, allow):
        print(f"denied {method} {host}:{port}", file=sys.stderr, flush=True)
        writer.write(_FORBIDDEN)
        await writer.drain()
        writer.close()
        return
    try:
        address = await _resolve(host, port)
        if address is None:
            print(f"denied {host}:{port}: loopback or link-local", file=sys.stderr, flush=True)
            writer.write(_FORBIDDEN)
            await writer.drain()
            writer.close()
            return
        upstream_reader, upstream_writer = await asyncio.wait_for(
            asyncio.open_connection(address, port), 30
        )
    except (OSError, TimeoutError):
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()
        return
    if method.upper() == "CONNECT":
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await writer.drain()
    else:
        url = urlsplit(target)
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        upstream_writer.write(f"{method} {path} {version}\r\n".encode("latin-1") + rest)
        await upstream_writer.drain()
    await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))


async def serve(allow: list[str]) -> None:
    """Serve on PORT until killed."""
    server = await asyncio.start_server(lambda r, w: _handle(r, w, allow), "0.0.0.0", PORT)
    print(f"proxy on {PORT}, allow {allow}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(json.loads(os.environ.get("HYBRID_ALLOW", "[]"))))
