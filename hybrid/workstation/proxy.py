"""The allow-list egress proxy a workstation with ``network.mode = "egress"`` talks through.

This file runs *inside* hardened containers (stdlib only), in one of three roles:

- ``serve``: the proxy, on the default bridge (its route out). It listens on no TCP port at all,
  only on a unix socket in a tmpfs volume that the workstation never mounts. It forwards plain
  HTTP and HTTPS ``CONNECT`` to ``host[:port]`` patterns on the allow-list (fnmatch, port
  defaults to 80/443), resolves the name once, refuses if any address is loopback, link-local,
  private, shared (CGNAT), unique-local, reserved, unspecified, multicast or one of the host's
  own (IPv4 inside IPv6 is unwrapped first), and connects to the address it checked (no second
  lookup to rebind). Every
  request, allowed or not, is one JSON line on stdout: the engine keeps it (size-capped), out
  of the workstation's reach.
- ``relay``: holds the workstation's network namespace (only ``lo``) and forwards
  127.0.0.1:PORT to the proxy's unix socket, so the proxy is the one thing a workstation reaches.
- ``addresses``: run once in the host's network namespace to list the host's own addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import ipaddress
import json
import os
import socket
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from urllib.parse import urlsplit

PORT = 3128
SOCKET_DIR = "/run/hybrid-egress"
SOCKET = f"{SOCKET_DIR}/proxy.sock"
_LIMIT = 64 * 1024
_HOST_CHARS = 253

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# Named here, not left to ipaddress.is_global, whose tables differ between Python versions.
_NETWORKS: list[tuple[str, str]] = [
    ("0.0.0.0/8", "this-network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.168.0.0/16", "private"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("fc00::/7", "unique-local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
]
_CLASSES = [(ipaddress.ip_network(net), reason) for net, reason in _NETWORKS]
_NAT64 = [ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48")]


def allowed(host: str, port: int, patterns: list[str]) -> bool:
    """Whether ``host:port`` matches one of the allow-list patterns (``[v6]:port`` too)."""
    host = host.lower().rstrip(".")
    for pattern in patterns:
        pattern = pattern.lower()
        if pattern.startswith("["):
            name, _, rest = pattern[1:].partition("]")
            want = rest[1:] if rest.startswith(":") else ""
        else:
            name, _, want = pattern.partition(":")
        if fnmatch.fnmatchcase(host, name) and (not want or want == "*" or want == str(port)):
            return True
    return False


def _embedded(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64), if any."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in net for net in _NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def forbidden(address: str, own: Iterable[str] = ()) -> str | None:
    """Why no pattern may reach ``address`` (None when it may be), ``own`` being the host's."""
    try:
        ip: IPAddress = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address} is not an IP address"
    inner = _embedded(ip)
    if inner is not None:
        why = forbidden(str(inner), own)
        return f"{address} carries {why}" if why else None
    if ip.is_unspecified:
        return f"{ip} is unspecified"
    if ip.is_loopback:
        return f"{ip} is loopback"
    for net, reason in _CLASSES:
        if ip.version == net.version and ip in net:
            return f"{ip} is {reason}"
    if ip in {ipaddress.ip_address(a.split("%", 1)[0]) for a in own}:
        return f"{ip} is an address of the host"
    # Documentation and benchmarking ranges stay reachable: the internet never routes them,
    # and test networks (this machine's registries among them) use them as "outside".
    return None


def host_addresses() -> list[str]:
    """Every address of this network namespace's interfaces, and its default gateway."""
    found: set[str] = set()
    last = ""
    for line in _read("/proc/net/fib_trie").splitlines():
        line = line.strip()
        if line.startswith("|--"):
            last = line[3:].strip()
        elif line.startswith("/32 host LOCAL") and last:
            found.add(last)
    for line in _read("/proc/net/if_inet6").splitlines():
        if fields := line.split():
            found.add(str(ipaddress.IPv6Address(int(fields[0], 16))))
    for line in _read("/proc/net/route").splitlines()[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[2] != "00000000":
            found.add(
                str(ipaddress.IPv4Address(int.from_bytes(bytes.fromhex(fields[2]), "little")))
            )
    return sorted(found)


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError:
        return ""


def _printable(text: str) -> str:
    """``text`` with anything but printable ASCII escaped (it is the workstation's to choose)."""
    return "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in text)


def _target(method: str, target: str) -> tuple[str, int]:
    """(host, port) of a request line's target; ValueError if it names none."""
    if method == "CONNECT":
        url = urlsplit(f"//{target}")
        return url.hostname or "", url.port or 443
    url = urlsplit(target)
    if url.scheme.lower() != "http":
        raise ValueError("only http:// URLs and CONNECT are proxied")
    return url.hostname or "", url.port or 80


Log = Callable[[dict[str, object]], None]


def _print(event: dict[str, object]) -> None:
    print(json.dumps(event, ensure_ascii=True), flush=True)


class Proxy:
    """One proxy: the allow-list, the host's addresses, and where events go."""

    def __init__(self, allow: list[str], deny: Iterable[str] = (), log: Log = _print) -> None:
        self.allow = allow
        self.deny = sorted({*deny, *host_addresses()})
        self.log = log

    def _event(
        self, method: str, host: str, port: int, decision: str, reason: str, address: str = ""
    ) -> None:
        host = _printable(host[:_HOST_CHARS] + ("..." if len(host) > _HOST_CHARS else ""))
        self.log({
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "method": _printable(method[:16]), "host": host, "port": port, "decision": decision,
            "reason": _printable(reason[:512]), "address": address,
        })  # fmt: skip

    async def decide(self, host: str, port: int) -> tuple[str, str, str]:
        """(decision, reason, address): allow with the one address to connect to, deny or error."""
        if not host:
            return "deny", "the request names no host", ""
        if not allowed(host, port, self.allow):
            return "deny", "not on the allow-list", ""
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except (OSError, UnicodeError, ValueError) as exc:
            return "error", f"cannot resolve: {exc}", ""
        addresses = [str(info[4][0]) for info in infos]
        for address in addresses:
            why = forbidden(address, self.deny)
            if why:
                return "deny", why, address
        if not addresses:
            return "error", "resolves to nothing", ""
        return "allow", "on the allow-list", addresses[0]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            return
        request_line, _, rest = head.partition(b"\r\n")
        method, host, port = "?", "", 0
        try:
            method, target, version = request_line.decode("latin-1").split(" ", 2)
            method = method.upper()
            host, port = _target(method, target)
        except ValueError as exc:
            self._event(method, host, port, "deny", f"bad request: {exc}")
            await _reply(writer, b"400 Bad Request")
            return
        decision, reason, address = await self.decide(host, port)
        if decision != "allow":
            self._event(method, host, port, decision, reason, address)
            await _reply(writer, b"403 Forbidden" if decision == "deny" else b"502 Bad Gateway")
            return
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(address, port), 30
            )
        except (OSError, TimeoutError) as exc:
            self._event(
                method, host, port, "error", f"cannot connect: {exc or 'timed out'}", address
            )
            await _reply(writer, b"502 Bad Gateway")
            return
        self._event(method, host, port, "allow", reason, address)
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
        else:
            url = urlsplit(target)
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            upstream_writer.write(f"{method} {path} {version}\r\n".encode("latin-1") + rest)
            await upstream_writer.drain()
        await _splice((reader, writer), (upstream_reader, upstream_writer))

    async def serve(self, path: str = SOCKET) -> None:
        """Serve on the unix socket ``path`` until cancelled."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = await asyncio.start_unix_server(self.handle, path)
        os.chmod(path, 0o600)
        print(f"proxy on {path}, allow {self.allow}, deny {self.deny}", file=sys.stderr, flush=True)
        async with server:
            await server.serve_forever()


async def _reply(writer: asyncio.StreamWriter, status: bytes) -> None:
    writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    with contextlib.suppress(OSError):
        await writer.drain()


async def _splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """Copy both ways until both ends are done; an end's EOF half-closes the other side."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(_LIMIT):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    tasks = [asyncio.ensure_future(pipe(a[0], b[1])), asyncio.ensure_future(pipe(b[0], a[1]))]
    try:
        await asyncio.gather(*tasks)
    except OSError:
        pass  # a reset on either side ends both
    finally:
        for task in tasks:
            task.cancel()
        a[1].close()
        b[1].close()


async def relay(path: str = SOCKET, port: int = PORT) -> None:
    """Forward 127.0.0.1:``port`` to the proxy's unix socket ``path`` until cancelled."""

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(path)
        except OSError:
            writer.close()
            return
        await _splice((reader, writer), (up_reader, up_writer))

    server = await asyncio.start_server(forward, "127.0.0.1", port)
    print(f"relay 127.0.0.1:{port} -> {path}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    role = argv[1] if len(argv) > 1 else "serve"
    if role == "addresses":
        print(json.dumps(host_addresses()))
    elif role == "relay":
        asyncio.run(relay())
    else:
        allow = json.loads(os.environ.get("HYBRID_ALLOW", "[]"))
        deny = json.loads(os.environ.get("HYBRID_DENY", "[]"))
        asyncio.run(Proxy(allow, deny).serve())


if __name__ == "__main__":
    main(sys.argv)
