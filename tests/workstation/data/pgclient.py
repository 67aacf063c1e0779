"""A minimal PostgreSQL client (stdlib only) for tests inside a workstation.

``python3 pgclient.py "SQL"`` connects to $DATABASE_URL with SCRAM-SHA-256, runs one simple
query and prints each row tab-separated; exit 1 with the server's message on an error.
"""

import base64
import hashlib
import hmac
import os
import secrets
import socket
import struct
import sys
from urllib.parse import urlparse


def message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def read(sock: socket.socket) -> tuple[bytes, bytes]:
    head = recv(sock, 5)
    return head[:1], recv(sock, struct.unpack("!I", head[1:])[0] - 4)


def recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise SystemExit("connection closed")
        data += chunk
    return data


def fail(body: bytes) -> None:
    fields = dict((f[:1], f[1:]) for f in body.split(b"\0") if f)
    raise SystemExit(fields.get(b"M", body).decode())


def scram(sock: socket.socket, password: str) -> None:
    nonce = base64.b64encode(secrets.token_bytes(18)).decode()
    first = f"n=,r={nonce}"
    initial = f"n,,{first}".encode()
    body = b"SCRAM-SHA-256\0" + struct.pack("!I", len(initial)) + initial
    sock.sendall(message(b"p", body))
    kind, body = read(sock)
    if kind == b"E":
        fail(body)
    server_first = body[4:].decode()
    attrs = dict(item.split("=", 1) for item in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored = hashlib.sha256(client_key).digest()
    final = f"c=biws,r={attrs['r']}"
    auth = f"{first},{server_first},{final}".encode()
    signature = hmac.new(stored, auth, "sha256").digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    sock.sendall(message(b"p", f"{final},p={base64.b64encode(proof).decode()}".encode()))


def main() -> None:
    url = urlparse(os.environ["DATABASE_URL"])
    sock = socket.create_connection((url.hostname, url.port or 5432), timeout=10)
    params = f"user\0{url.username}\0database\0{url.path.lstrip('/')}\0\0".encode()
    sock.sendall(struct.pack("!II", len(params) + 8, 196608) + params)
    while True:
        kind, body = read(sock)
        if kind == b"E":
            fail(body)
        if kind == b"R":
            code = struct.unpack("!I", body[:4])[0]
            if code == 10:
                scram(sock, url.password or "")
        if kind == b"Z":
            break
    sock.sendall(message(b"Q", sys.argv[1].encode() + b"\0"))
    while True:
        kind, body = read(sock)
        if kind == b"E":
            fail(body)
        if kind == b"D":
            count, at, row = struct.unpack("!H", body[:2])[0], 2, []
            for _ in range(count):
                size = struct.unpack("!i", body[at : at + 4])[0]
                at += 4
                row.append("NULL" if size < 0 else body[at : at + size].decode())
                at += max(size, 0)
            print("\t".join(row))
        if kind == b"Z":
            return


if __name__ == "__main__":
    main()
