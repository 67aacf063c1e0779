"""The server's life: only its own user is served, a stale socket is replaced, it exits when
idle, it serves clients in parallel, it starts on first use, and TCP needs the token."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from server_kit import Server, gone, normal, wait_for

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
