"""A second local user against every listener hybrid opens: refused every time.

The test makes a real account (``useradd``, a throwaway name, removed with its home after) and
runs each probe as that user (``setpriv --reuid/--regid --clear-groups``): the resident server's
Unix socket and its control socket, ``hybrid serve --tcp`` without the token, ``hybrid mcp
--transport http`` without a token and with a wrong one (and its ``--unix-socket``), and the
local Ray cluster's GCS, raylet and worker ports, through the machine's outward addresses
(refused: they listen on loopback alone) and through loopback without Ray's token (refused where
the installed Ray has token authentication). Each time the owner's own client still works.

The probes are stdlib Python, except the Ray one, which needs Ray: when the interpreter lives
under a directory other users cannot enter (pyenv under /root), that probe runs in a private
mount namespace where an empty directory stands in for that one and only the interpreter's tree
is bound back (nothing changes on the host).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile_kit import host_addresses

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "server"))

from server_kit import Server, gone, wait_for  # noqa: E402

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a second user"),
]

SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Not a tier case (the suite's own check runs per tier): each test here cleans up itself."""
    yield


@pytest.fixture(scope="module")
def stranger() -> Iterator[tuple[int, int]]:
    """A real second account (uid, gid), removed with its home afterwards."""
    name = f"hyb2-{secrets.token_hex(4)}"
    made = subprocess.run(
        ["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.fail(f"useradd failed: {made.stderr.strip()}")
    try:
        import pwd

        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", "--remove", name], capture_output=True)


def as_stranger(
    user: tuple[int, int], source: str, *args: str, python: str = SYSTEM_PYTHON, timeout: float = 60
) -> Any:
    """Run ``source`` as the second user; the JSON it prints last."""
    uid, gid = user
    drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    argv = [*drop, python, "-I", "-c", source, *args]
    hidden = _hidden_ancestor(python)
    if hidden is not None:
        argv = _behind_namespace(argv, hidden, Path(sys.base_prefix), Path(sys.prefix))
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _hidden_ancestor(path: str) -> Path | None:
    """The top directory above ``path`` that other users cannot enter, if any."""
    for parent in reversed(Path(path).parents):
        if parent != Path("/") and not parent.stat().st_mode & 0o001:
            return parent
    return None


def _behind_namespace(argv: list[str], hidden: Path, *trees: Path) -> list[str]:
    """``argv`` in a private mount namespace where ``hidden`` is an empty tmpfs with only
    ``trees`` bound back into it (the host's mounts are untouched)."""
    stage = Path("/tmp") / f"hyb2-stage-{secrets.token_hex(4)}"
    lines = ["set -e", f"mkdir -p {stage}", f"mount --bind {hidden} {stage}"]
    lines.append(f"mount -t tmpfs -o mode=0755 tmpfs {hidden}")
    for tree in {t for t in trees if hidden in t.parents}:
        inside = tree.relative_to(hidden)
        lines += [f"mkdir -p {hidden / inside}", f"mount --bind {stage / inside} {hidden / inside}"]
    lines += [f"umount -l {stage}", f"rmdir {stage}"]
    lines.append('exec "$@"')
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "\n".join(lines),
        "sh",
        *argv,
    ]


def frame(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack(">I", len(payload)) + payload


# -- the resident server: its Unix socket, its control socket, and --tcp -----------------------

_UNIX_PROBE = """
import json, os, socket, struct, sys
found = {}
for name in sys.argv[1:]:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(20)
    try:
        sock.connect(name)
        r, w = os.pipe()
        header = json.dumps({"op": "run" if name.endswith(".sock") else "status",
                             "argv": ["py", "eval", "print(42)"], "cwd": "/", "env": {}}).encode()
        socket.send_fds(sock, [b"H" + struct.pack(">I", len(header)) + header], [0, w, 2])
        os.close(w)
        reply = sock.recv(4096)
        os.set_blocking(r, False)
        try:
            out = os.read(r, 100)
        except BlockingIOError:
            out = b""
        found[name] = {"reply": reply.decode(errors="replace"), "out": out.decode(errors="replace")}
    except OSError as exc:
        found[name] = {"refused": type(exc).__name__}
print(json.dumps(found))
"""

_TCP_PROBE = """
import json, socket, struct, sys
host, port = sys.argv[1].rsplit(":", 1)
found = {}
header = json.dumps({"op": "run", "argv": ["py", "eval", "print(42)"], "cwd": "/", "env": {},
                     "stdio": "relay", "token": ""}).encode()
for name, first in (("no token", b"T" + struct.pack(">I", 0)),
                    ("wrong token", b"T" + struct.pack(">I", 43) + b"x" * 43),
                    ("header first", b"H" + struct.pack(">I", len(header)) + header)):
    sock = socket.create_connection((host, int(port)), timeout=20)
    sock.sendall(first)
    reply = b""
    try:
        while chunk := sock.recv(4096):
            reply += chunk
    except OSError:
        pass
    found[name] = reply.decode(errors="replace")
try:
    open(sys.argv[2]).read()
    found["token file"] = "read"
except OSError as exc:
    found["token file"] = type(exc).__name__
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def public_tmp() -> Iterator[Path]:
    """A directory under /tmp that every user may enter (what is inside keeps its own modes)."""
    import shutil
    import tempfile

    made = Path(tempfile.mkdtemp(prefix="hyb2-", dir="/tmp"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(scope="module")
def server(public_tmp: Path) -> Iterator[Server]:
    made = Server(public_tmp / "run", "--pool-size", "0", "--idle", "600", "--workers", "1")
    made.options += ("--tcp", "127.0.0.1:0")
    made.start()
    yield made
    pids = made.pids()
    made.stop()
    wait_for(lambda: all(gone(p) for p in pids), 60, "the server to exit")


@contextlib.contextmanager
def opened(directory: Path, *sockets: Path) -> Iterator[None]:
    """``directory`` and ``sockets`` open to everyone, so only the listener's own check (the
    peer's uid) stands in the way."""
    saved = [(p, p.stat().st_mode & 0o777) for p in (directory, *sockets)]
    directory.chmod(0o755)
    for path in sockets:
        path.chmod(0o777)
    try:
        yield
    finally:
        for path, mode in saved:
            path.chmod(mode)


def test_the_servers_unix_sockets_refuse_another_user(
    stranger: tuple[int, int], server: Server
) -> None:
    sock = Path(server.info["socket"])
    control = sock.with_suffix(".ctl")  # status and stop, answered by the daemon itself
    assert control.is_socket()
    with opened(sock.parent, sock, control):
        found = as_stranger(stranger, _UNIX_PROBE, str(sock), str(control))
    for name in (str(sock), str(control)):
        answer = found[name]
        assert answer.get("reply", "") == answer.get("out", "") == "", found
        assert answer.get("refused") in (None, "BrokenPipeError", "ConnectionResetError"), found
    ok = server.hybrid("py", "eval", "print(42)")
    assert (ok.returncode, ok.stdout) == (0, "42\n")
    assert (server.status() or {}).get("pid") == server.info["pid"]


def test_serve_tcp_refuses_another_user(stranger: tuple[int, int], server: Server) -> None:
    token_file = str(Path(server.info["socket"]).with_suffix(".token"))
    found = as_stranger(stranger, _TCP_PROBE, server.info["tcp"], token_file)
    assert found["token file"] == "PermissionError", found
    for name in ("no token", "wrong token", "header first"):
        assert "bad token" in found[name] and "42" not in found[name], found
    token = Path(token_file).read_text().strip()
    url = {"HYBRID_SERVER_URL": f"tcp://{server.info['tcp']}", "HYBRID_SERVER_TOKEN": token}
    ok = server.hybrid("py", "eval", "print(42)", **url)
    assert (ok.returncode, ok.stdout) == (0, "42\n"), ok.stderr


# -- hybrid mcp --transport http ---------------------------------------------------------------

_HTTP_PROBE = """
import json, sys, urllib.request, urllib.error
url, token_file = sys.argv[1], sys.argv[2]

def post(message, headers):
    request = urllib.request.Request(url, data=json.dumps(message).encode(), method="POST",
        headers={"Content-Type": "application/json",
                 "Accept": "application/json, text/event-stream", **headers})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, dict(answer.headers), answer.read(200000).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read(2000).decode(errors="replace")

found = {}
for name, headers in (("no token", {}), ("wrong token", {"Authorization": "Bearer " + "x" * 43})):
    # What an MCP client does: initialize, then call context_pack on the owner's repository.
    status, answered, text = post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "stranger", "version": "0"}}}, headers)
    found[name] = [status, text[:300]]
    session = {k: v for k, v in answered.items() if k.lower() == "mcp-session-id"}
    if status != 200:
        continue
    headers = {**headers, **session, "MCP-Protocol-Version": "2025-06-18"}
    post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    status, _, text = post({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "context_pack", "arguments": {"task": "the TOKEN in secret.py"}}}, headers)
    found[name].append(text[-3000:])
try:
    open(token_file).read()
    found["token file"] = "read"
except OSError as exc:
    found["token file"] = type(exc).__name__
print(json.dumps(found))
"""

_UDS_PROBE = """
import json, socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.settimeout(20)
try:
    sock.connect(sys.argv[1])
    sock.sendall(b"POST /mcp HTTP/1.1\\r\\nHost: localhost\\r\\nContent-Length: 2\\r\\n\\r\\n{}")
    reply = sock.recv(4096).decode(errors="replace")
except OSError as exc:
    reply = type(exc).__name__
print(json.dumps({"reply": reply}))
"""


def _mcp(*args: str, root: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hybrid",
            "mcp",
            "--transport",
            "http",
            "--root",
            str(root),
            "--json",
            *args,
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"hybrid mcp did not start: {proc.communicate()[1].decode()[-2000:]}")
    return proc, json.loads(line)


def _wait_listening(shown: dict[str, Any]) -> None:
    def up() -> bool:
        try:
            if "unix_socket" in shown:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(shown["unix_socket"])
            else:
                host, port = shown["url"].split("//")[1].split("/")[0].rsplit(":", 1)
                socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            return False
        return True

    wait_for(up, 60, "hybrid mcp to listen")


def test_mcp_http_refuses_another_user(stranger: tuple[int, int], tmp_path: Path) -> None:
    """The attack of issue 29: another uid read a 0700 repository through context_pack."""
    repo = tmp_path / "private"
    repo.mkdir(mode=0o700)
    (repo / "secret.py").write_text("TOKEN = 'owner-only-7f3a'\n")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    proc, shown = _mcp("--port", str(port), root=repo)
    try:
        _wait_listening(shown)
        from hybrid.paths import runtime_dir

        token_file = shown.get("token_file") or str(runtime_dir() / "mcp.token")
        found = as_stranger(stranger, _HTTP_PROBE, shown["url"], token_file)
        assert found["token file"] == "PermissionError", found
        for name in ("no token", "wrong token"):
            assert found[name][0] == 401, found
            assert "owner-only" not in json.dumps(found), found
        status, _, _ = _owner_call(shown)
        assert status == 200
    finally:
        proc.terminate()
        proc.wait(60)


def _owner_call(shown: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    import urllib.request

    token = Path(shown["token_file"]).read_text().strip()
    request = urllib.request.Request(
        shown["url"],
        method="POST",
        data=json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "owner", "version": "0"},
                },
            }
        ).encode(),
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {token}",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.status, dict(answer.headers), answer.read(2000)


def test_mcp_unix_socket_refuses_another_user(
    stranger: tuple[int, int], tmp_path: Path, public_tmp: Path
) -> None:
    repo = tmp_path / "private"
    repo.mkdir(mode=0o700)
    path = public_tmp / "mcp.sock"
    proc, shown = _mcp("--unix-socket", str(path), root=repo)
    try:
        _wait_listening(shown)
        # As made (0600): the kernel refuses the connect. Opened to all: the peer check closes it.
        assert as_stranger(stranger, _UDS_PROBE, str(path)) == {"reply": "PermissionError"}
        with opened(public_tmp, path):
            found = as_stranger(stranger, _UDS_PROBE, str(path))
        assert found["reply"] in ("", "ConnectionResetError", "BrokenPipeError"), found
        with socket.socket(socket.AF_UNIX) as own:
            own.settimeout(20)
            own.connect(str(path))
            own.sendall(
                b"GET /mcp HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n"
            )
            assert own.recv(4096).startswith(b"HTTP/1.1 ")
    finally:
        proc.terminate()
        proc.wait(60)


# -- the local Ray cluster ---------------------------------------------------------------------

_PORT_PROBE = """
import json, socket, sys
found = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        found[target] = "connected"
    except OSError as exc:
        found[target] = type(exc).__name__
print(json.dumps(found))
"""

_GCS_PROBE = """
import json, sys
from ray._raylet import GcsClient
found = {}
try:
    client = GcsClient(address=sys.argv[1])
    found["keys"] = len(client.internal_kv_keys(b"", None, timeout=10))
    client.internal_kv_put(b"hyb2", b"owned", True, None, timeout=10)
    found["put"] = "written"
except Exception as exc:
    found["refused"] = type(exc).__name__ + ": " + str(exc)[:200]
print(json.dumps(found))
"""


def _listening_ports(pids: set[int]) -> list[int]:
    """TCP ports the processes ``pids`` listen on."""
    out = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, check=True).stdout
    ports = []
    for line in out.splitlines():
        if any(f"pid={pid}," in line for pid in pids):
            ports.append(int(line.split()[3].rsplit(":", 1)[1]))
    return sorted(set(ports))


def test_the_ray_cluster_refuses_another_user(stranger: tuple[int, int]) -> None:
    pytest.importorskip("ray")
    from hybrid.raylocal import LocalCluster

    outward = [a for a in host_addresses() if ":" not in a and not a.startswith("127.")]
    if not outward:
        pytest.skip("this host has no non-loopback IPv4 address")
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    with LocalCluster(nodes=2, cpus=1, env={"PYTHONPATH": path}) as cluster:
        mine = set(cluster._tree(cluster._mine()))
        ports = _listening_ports(mine)
        assert cluster.port in ports and len(ports) >= 3  # the GCS and both raylets at least
        targets = [f"{a}:{p}" for a in outward for p in ports]
        found = as_stranger(stranger, _PORT_PROBE, *targets)
        assert set(found.values()) == {"ConnectionRefusedError"}, found
        if cluster.authenticated:
            # On loopback the port is open (it is the owner's cluster), but not without the token.
            for env in (
                {"RAY_AUTH_MODE": "disabled"},
                {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "x" * 43},
            ):
                found = _gcs_probe_as(stranger, cluster.address, env)
                assert "keys" not in found and "Authentication" in found.get("refused", ""), found
            token_file = cluster.auth["RAY_AUTH_TOKEN_PATH"]
            unreadable = as_stranger(
                stranger,
                "import json,sys\ntry:\n open(sys.argv[1]).read(); r='read'\nexcept OSError as e:\n r=type(e).__name__\nprint(json.dumps(r))",
                token_file,
            )
            assert unreadable == "PermissionError"
        # The owner's client still works.
        done = subprocess.run(
            [sys.executable, "-c", _GCS_PROBE, cluster.address],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **cluster.auth},
        )
        owner = json.loads(done.stdout.strip().splitlines()[-1])
        assert owner.get("put") == "written", owner


def _gcs_probe_as(user: tuple[int, int], address: str, env: dict[str, str]) -> dict[str, Any]:
    """The GCS probe as the second user, with Ray (see the module docstring) and ``env``."""
    setting = "".join(f"import os; os.environ[{k!r}] = {v!r}\n" for k, v in env.items())
    found: dict[str, Any] = as_stranger(
        user, setting + _GCS_PROBE, address, python=sys.executable, timeout=120
    )
    return found
