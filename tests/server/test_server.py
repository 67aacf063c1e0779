"""The server's life: only its own user is served, a stale socket is replaced, it exits when
idle, it serves clients in parallel, it starts on first use, and TCP needs the token; clients
without it hold no worker, a malformed header costs only its connection, --stop works while
every worker is busy, and a server stopped while warming up leaves no partial guest build."""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
from server_kit import CLIENT, Server, gone, normal, wait_for

from hybrid.server import wire

NOBODY = 65534

_PEER = """
import json, os, socket, struct
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect({path!r})
r, w = os.pipe()
header = json.dumps({{"op": "run", "argv": ["py", "eval", "print(42)"], "cwd": "/", "env": {{}}}}).encode()
try:
    socket.send_fds(sock, [b"H" + struct.pack(">I", len(header)) + header], [0, w, 2])
    os.close(w)
    reply = sock.recv(100)
except (BrokenPipeError, ConnectionResetError):  # dropped: the refusal
    reply = b""
os.set_blocking(r, False)
try:
    out = os.read(r, 100)
except BlockingIOError:
    out = b""
print(json.dumps({{"reply": reply.decode(), "out": out.decode()}}))
"""
PYTHON = "/usr/bin/python3"  # the user's own interpreter may sit where nobody can read it


def test_another_user_is_not_served(server: Server) -> None:
    if os.getuid() != 0 or not os.path.exists(PYTHON):
        pytest.skip("needs root (to act as another user) and /usr/bin/python3")
    sock = next(server.runtime.glob("serve-*.sock"))
    # Open the directory and the socket to everyone, so only the peer check stands in the way.
    server.runtime.chmod(0o755)
    sock.chmod(0o777)
    try:
        done = subprocess.run(
            [PYTHON, "-I", "-c", _PEER.format(path=str(sock))],
            capture_output=True,
            text=True,
            user=NOBODY,
            timeout=60,
        )
    finally:
        server.runtime.chmod(0o700)
        sock.chmod(0o600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"reply": "", "out": ""}
    # The server's own user still is.
    ok = server.hybrid("py", "eval", "print(42)")
    assert (ok.returncode, ok.stdout) == (0, "42\n")


def test_clients_are_served_in_parallel(server: Server) -> None:
    # Each job spins for 2 s and reports when it ran; served one after another, no two overlap.
    snippet = "import time\nt = time.time()\nwhile time.time() - t < 2: pass\nprint(t, time.time())"
    results: list[subprocess.CompletedProcess[str]] = []

    def one() -> None:
        results.append(server.hybrid("py", "eval", "--timeout", "120", snippet))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.returncode for r in results] == [0] * 4, [r.stderr for r in results]
    spans = sorted(tuple(map(float, r.stdout.split())) for r in results)
    overlapping = sum(1 for a, b in itertools.pairwise(spans) if b[0] < a[1])
    assert overlapping >= 1, spans


def _fresh(tmp_path: Path, *options: str) -> Server:
    return Server(tmp_path / "run", *options)


def test_first_use_runs_here_then_starts_a_server(tmp_path: Path) -> None:
    """No server yet: the command runs in its own process, and a server starts once it is done
    (not beside it, where its warm-up would take this run's cores); the next command uses it."""
    made = _fresh(tmp_path)
    done = made.hybrid("py", "eval", "print(6 * 7)")
    assert done.returncode == 0 and done.stdout == "42\n", done.stderr
    try:
        wait_for(lambda: made.status() is not None, 300, "the server started on first use")
        served = (made.status() or {})["commands"]
        again = made.hybrid("py", "eval", "print(6 * 7)")
        assert again.returncode == 0 and again.stdout == "42\n", again.stderr
        assert (made.status() or {})["commands"] > served
    finally:
        made.stop()


def test_idle_server_exits_and_removes_its_socket(tmp_path: Path) -> None:
    made = _fresh(tmp_path, "--idle", "10", "--pool-size", "0", "--workers", "1")
    made.start()
    pids = made.pids()
    sock = Path(made.info["socket"])
    assert sock.exists()
    wait_for(lambda: all(gone(p) for p in pids), 120, "the idle server to exit")
    assert not sock.exists()


def test_stale_socket_is_replaced(tmp_path: Path) -> None:
    made = _fresh(tmp_path, "--idle", "120", "--pool-size", "0", "--workers", "1")
    made.start()
    pids = made.pids()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all(gone(p) for p in pids), 30, "the killed server")
    sock = Path(made.info["socket"])
    assert sock.exists()  # left behind by the killed server
    # A client finds nobody there and runs in process (and starts a new server).
    done = made.hybrid("py", "eval", "print(5)")
    assert (done.returncode, done.stdout) == (0, "5\n"), done.stderr
    wait_for(lambda: made.status() is not None, 300, "a new server")
    fresh = made.status()
    assert fresh is not None and fresh["pid"] not in pids
    served = made.hybrid("py", "eval", "print(6)")
    assert (served.returncode, served.stdout) == (0, "6\n")
    made.stop()


def test_a_second_server_for_the_same_configuration_refuses(server: Server) -> None:
    done = server.hybrid("serve", "--idle", "5")
    assert done.returncode == 1
    assert "already runs" in done.stderr


def test_tcp_needs_the_token(tmp_path: Path) -> None:
    made = _fresh(
        tmp_path, "--idle", "120", "--pool-size", "0", "--workers", "1", "--tcp", "127.0.0.1:0"
    )
    made.start()
    try:
        address = made.info["tcp"]
        assert address.startswith("127.0.0.1:")
        token = Path(made.info["socket"]).with_suffix(".token").read_text().strip()
        url = {"HYBRID_SERVER_URL": f"tcp://{address}"}
        wrong = made.hybrid("py", "eval", "print(7)", HYBRID_SERVER_TOKEN="nope", **url)
        assert wrong.returncode == 77 and "bad token" in wrong.stderr
        assert wrong.stdout == ""
        right = made.hybrid(
            "check", "csv", "-", stdin=b"a,b\n1,2\n", HYBRID_SERVER_TOKEN=token, **url
        )
        local = made.local("check", "csv", "-", stdin=b"a,b\n1,2\n")
        assert right.returncode == local.returncode == 0
        assert normal(right.stdout) == normal(local.stdout)
    finally:
        made.stop()


def test_the_socket_is_only_the_users(server: Server) -> None:
    sock = next(server.runtime.glob("serve-*.sock"))
    assert sock.stat().st_mode & 0o077 == 0
    assert server.runtime.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    "env",
    [
        {"HYBRID_RUNTIME_DIR": "rt"},
        {"XDG_RUNTIME_DIR": "xdg-rt"},
        {"HYBRID_STATE_DIR": "state"},
        {"XDG_STATE_HOME": "xdg-state"},
        {"HOME": "home"},
    ],
)
def test_the_runtime_directory_follows_the_state_root(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hybrid import paths

    for name in ("HYBRID_RUNTIME_DIR", "XDG_RUNTIME_DIR", "HYBRID_STATE_DIR", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, str(tmp_path / value))
    made = paths.runtime_dir()
    expected = {
        "HYBRID_RUNTIME_DIR": tmp_path / "rt",
        "XDG_RUNTIME_DIR": tmp_path / "xdg-rt" / "hybrid",
    }.get(next(iter(env)), paths.state_root() / "run")
    assert made == expected
    assert made.stat().st_mode & 0o777 == 0o700
    assert wire.socket_path().startswith(str(made) + "/serve-")


def test_a_directory_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give the directory away")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    monkeypatch.setenv("HYBRID_RUNTIME_DIR", str(theirs))
    with pytest.raises(PermissionError):
        wire.runtime_path()


def _frame(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack(">I", len(payload)) + payload


def _worker_pids(made: Server) -> list[int]:
    return sorted(made.pids()[1:])


def test_tcp_clients_without_the_token_hold_no_worker(tmp_path: Path) -> None:
    """Two peers that trickle a byte every half second never reach the only worker: a client
    with the token and a local one are both served at once, and the trickle is cut off."""
    made = _fresh(tmp_path, "--idle", "120", "--pool-size", "0", "--workers", "1")
    made.options += ("--max-workers", "1", "--tcp", "127.0.0.1:0")
    made.start()
    stop = threading.Event()
    host, port = made.info["tcp"].rsplit(":", 1)
    squatters = [socket.create_connection((host, int(port))) for _ in range(2)]
    heard: dict[int, bytes] = {}

    def trickle(index: int, sock: socket.socket) -> None:
        # A token frame that would take 100 s to arrive, a byte every half second, until the
        # server says something.
        for byte in _frame(b"T", b"x" * 200):
            if stop.is_set():
                return
            readable, _, _ = select.select([sock], [], [], 0.5)
            if readable:
                break
            try:
                sock.send(bytes([byte]))
            except OSError:
                break
        sock.settimeout(5)
        try:
            heard[index] = sock.recv(4096)
        except OSError:
            heard[index] = b""

    threads = [
        threading.Thread(target=trickle, args=(i, s), daemon=True) for i, s in enumerate(squatters)
    ]
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.5)  # both are connected and trickling
        token = Path(made.info["socket"]).with_suffix(".token").read_text().strip()
        url = {"HYBRID_SERVER_URL": f"tcp://{made.info['tcp']}", "HYBRID_SERVER_TOKEN": token}
        csv = b"a,b\n1,2\n"
        started = time.monotonic()
        remote = made.hybrid("check", "csv", "-", stdin=csv, timeout=45, **url)
        local = made.hybrid("check", "csv", "-", stdin=csv, timeout=45)
        assert time.monotonic() - started < 25  # not after the squatters (they take 100 s)
        assert (remote.returncode, local.returncode) == (0, 0), remote.stderr + local.stderr
        assert "running it here" not in remote.stderr  # the server ran it
        assert (made.status() or {}).get("commands", 0) >= 2
        for thread in threads:
            thread.join(20)
        # Cut off at the token deadline with one line, long before the trickle could finish.
        assert all(b"no token within" in heard.get(i, b"") for i in range(2)), heard
    finally:
        stop.set()
        for sock in squatters:
            sock.close()
        made.stop()


@pytest.mark.parametrize("over", ["unix", "tcp"])
def test_a_malformed_header_costs_only_its_connection(tmp_path: Path, over: str) -> None:
    """200,000 '[' (deeper than the JSON parser goes), then a header that is no request: each
    gets one error line and exit code 2; the one worker lives on and serves the next command."""
    made = _fresh(tmp_path, "--idle", "120", "--pool-size", "0", "--workers", "1")
    made.options += ("--max-workers", "1", *(("--tcp", "127.0.0.1:0") if over == "tcp" else ()))
    made.start()
    try:
        before = _worker_pids(made)
        for header in (b"[" * 200_000, b'{"op": "run", "argv": "py", "env": []}'):
            if over == "tcp":
                host, port = made.info["tcp"].rsplit(":", 1)
                sock = socket.create_connection((host, int(port)), timeout=30)
                token = Path(made.info["socket"]).with_suffix(".token").read_text().strip().encode()
                sock.sendall(_frame(b"T", token))
                assert sock.recv(5) == _frame(b"W", b"")
            else:
                sock = socket.socket(socket.AF_UNIX)
                sock.settimeout(30)
                sock.connect(wire.address(made.info["socket"]))
            with sock:
                sock.sendall(_frame(b"H", header))
                reply = b""
                while chunk := sock.recv(4096):
                    reply += chunk
            assert reply == _frame(b"E", b"hybrid: error: server: malformed request\n") + _frame(
                b"X", b"2"
            )
        assert _worker_pids(made) == before
        ok = made.hybrid("py", "eval", "print(42)")
        assert (ok.returncode, ok.stdout) == (0, "42\n")
    finally:
        made.stop()


def test_stop_works_while_every_worker_is_busy(tmp_path: Path) -> None:
    made = _fresh(tmp_path, "--idle", "120", "--pool-size", "0", "--workers", "1")
    made.options += ("--max-workers", "1")
    made.start()
    pids = made.pids()
    # Longer than a client waits to connect (30 s): a stop that needs a worker never comes.
    busy = subprocess.Popen(
        [*CLIENT, "py", "eval", "--timeout", "90", "import time\ntime.sleep(45)"],
        env=made.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: (made.status() or {}).get("busy") == 1, 30, "the worker to be busy")
        started = time.monotonic()
        done = made.hybrid("serve", "--stop", timeout=60)
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started < 20
        wait_for(lambda: all(gone(p) for p in pids), 60, "the server to exit")
        busy.wait(30)  # its command ended with the server
    finally:
        busy.kill()
        busy.wait()


def _componentize_of(cache: Path) -> list[int]:
    """Processes building the python-wasm guest into ``cache``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if b"componentize_py" not in (entry / "cmdline").read_bytes():
                continue
            if f"HYBRID_CACHE_DIR={cache}".encode() in (entry / "environ").read_bytes().split(
                b"\0"
            ):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def test_a_server_stopped_while_warming_up_leaves_no_partial_build(tmp_path: Path) -> None:
    """With an empty cache the workers build the python-wasm guest as they warm up; `--stop`
    during the build ends it (and the build) and leaves no partial file in the cache."""
    cache = tmp_path / "cache"
    made = _fresh(tmp_path, "--idle", "120", "--pool-size", "0", "--workers", "1")
    made.env["HYBRID_CACHE_DIR"] = str(cache)
    daemon = subprocess.Popen(
        [*CLIENT, "serve", "--quiet", "--pool-size", "0", "--workers", "1", "--idle", "120"],
        env=made.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: _componentize_of(cache), 180, "the guest build to start")
        done = made.hybrid("serve", "--stop", timeout=60)
        assert done.returncode == 0, done.stderr
        assert daemon.wait(60) == 0
        wait_for(lambda: not _componentize_of(cache), 30, "the guest build to stop")
        left = [p.name for p in cache.rglob("*") if p.name.startswith(".build-")]
        assert not left, left
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
        for pid in _componentize_of(cache):
            os.kill(pid, signal.SIGKILL)
