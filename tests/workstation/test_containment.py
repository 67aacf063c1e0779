"""Hostile code against the real sandbox, once under runc and once under runsc (gVisor)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hybrid.results import Termination
from hybrid.workstation.jobuser import JOB_UID

pytestmark = pytest.mark.engine

FORK_BOMB = textwrap.dedent(
    """
    import errno, os, time
    n = 0
    try:
        while True:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
            n += 1
    except OSError as e:
        print("stopped", n, errno.errorcode[e.errno], flush=True)
    """
)

MEMORY_BOMB = "x = []\nwhile True:\n    x.append(bytearray(16 * 1024 * 1024))\n"

LIST_PROCESSES = textwrap.dedent(
    """
    import os
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
                print(cmdline.replace(b"\\0", b" ").replace(b"\\n", b" ").decode())
            except OSError:
                pass
    """
)


def test_fork_bomb_stops_at_the_pids_limit(engine, tier, make_spec):
    with engine.create(make_spec(tier, pids=32, memory="1G", wall_seconds=60)) as ws:
        result = ws.exec(["python3", "-c", FORK_BOMB])
        if tier == "docker":
            # runc: fork fails with EAGAIN before the limit and the bomb reports it.
            assert result.termination is Termination.OK, result
            stopped, count, code = result.stdout.split()
            assert (stopped, code) == ("stopped", "EAGAIN")
            assert 0 < int(count) < 32
        else:
            # gVisor: the host pids cgroup kills the whole sandbox; the supervisor reports it.
            assert result.termination is not Termination.OK, result
            assert "sandbox died" in result.detail or "EAGAIN" in result.stdout
        # Whatever the bomb left never exceeds the limit; stop() clears it and the files stay.
        during = ws.exec(["python3", "-c", LIST_PROCESSES])
        if during.ok:
            assert len(during.stdout.splitlines()) <= 32
        ws.stop()
        after = ws.exec(["python3", "-c", LIST_PROCESSES])
        assert after.ok, after
        assert "time.sleep(60)" not in after.stdout


def test_memory_bomb_is_killed_and_reported(engine, tier, make_spec):
    with engine.create(make_spec(tier, memory="128M")) as ws:
        result = ws.exec(["python3", "-c", MEMORY_BOMB])
        assert result.termination is Termination.OUT_OF_MEMORY, result
        assert result.exit_code is None
        assert ws.exec("echo alive").stdout == "alive\n"


def test_sleep_forever_is_killed_at_the_deadline_with_partial_output(ws):
    marker = "4242.5"  # a sleep length no other process on the host uses
    start = time.monotonic()
    result = ws.exec(f"echo partial-output; sleep {marker}; echo never", timeout=2)
    elapsed = time.monotonic() - start
    assert result.termination is Termination.TIMEOUT, result
    assert result.stdout == "partial-output\n"
    assert result.exit_code is None
    assert elapsed < 10
    # Nothing is left: not inside the workstation, not on the host.
    inside = ws.exec(["python3", "-c", LIST_PROCESSES])
    assert inside.ok and f"sleep {marker}" not in inside.stdout
    host = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert host.stdout.strip() == ""


def test_network_connection_attempt_fails(ws):
    script = textwrap.dedent(
        """
        import socket
        print(sorted(name for _, name in socket.if_nameindex()))
        for host, port in (("1.1.1.1", 80), ("8.8.8.8", 53), ("172.17.0.1", 2375)):
            try:
                socket.create_connection((host, port), timeout=3).close()
                print("connected", host)
            except OSError as e:
                print("refused", host, type(e).__name__)
        """
    )
    result = ws.exec(["python3", "-c", script])
    assert result.ok, result
    lines = result.stdout.splitlines()
    assert lines[0] == "['lo']"
    assert not any(line.startswith("connected") for line in lines)
    assert len([line for line in lines if line.startswith("refused")]) == 3


def test_writing_the_read_only_root_fails(ws):
    for path in ("/etc/hybrid-probe", "/usr/bin/hybrid-probe", "/hybrid-probe"):
        result = ws.exec(["sh", "-c", f"echo x > {path}"])
        assert result.termination is Termination.NONZERO_EXIT, (path, result)
    assert ws.exec("echo ok > /workspace/probe && echo ok > /tmp/probe").ok
    status = ws.exec(["cat", "/proc/self/status"]).stdout
    assert "CapEff:\t0000000000000000" in status
    assert ws.exec("id -u").stdout.strip() == str(JOB_UID)


def test_no_host_secret_is_visible(engine, tier, make_spec, monkeypatch):
    monkeypatch.setenv("HYBRID_PROBE_SECRET", "hunter2-do-not-leak")
    with engine.create(make_spec(tier)) as ws:
        env = ws.exec(["env"])
        assert env.ok and "hunter2" not in env.stdout
        assert "HYBRID_PROBE_SECRET" not in env.stdout
        probes = [
            "/var/run/docker.sock",
            "/run/docker.sock",
            "/root/.ssh",
            os.path.expanduser("~/.ssh"),
            os.path.expanduser("~/.docker"),
            "/run/containerd",
        ]
        listing = ws.exec(
            ["python3", "-c", f"import os; print([p for p in {probes!r} if os.path.exists(p)])"]
        )
        assert listing.stdout.strip() == "[]", listing
        init_env = ws.exec(["sh", "-c", "cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'"])
        assert "hunter2" not in init_env.stdout


def test_gc_removes_a_container_left_by_a_killed_client(engine, tier, make_spec, tmp_path):
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, signal
            from hybrid.workstation import backend
            from hybrid.policy import SandboxSpec
            ws = backend().create(SandboxSpec(tier={tier!r}))
            print(ws.name, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    name = proc.stdout.strip()
    assert name in [w.name for w in engine.list()]
    report = engine.gc()
    assert name in report.containers
    assert f"hybrid-{name}-workspace" in report.volumes
    assert name not in [w.name for w in engine.list()]


HASH_TREE = textwrap.dedent(
    """
    import hashlib, os, stat
    for root, dirs, files in os.walk("."):
        dirs[:] = sorted(d for d in dirs if d != ".hybrid")
        for name in sorted(files):
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            digest = hashlib.sha256(open(path, "rb").read()).hexdigest()[:16]
            print(path, oct(stat.S_IMODE(mode)), digest)
    """
)


def test_snapshot_restores_files_and_installed_packages(engine, tier, make_spec):
    with engine.create(make_spec(tier, wall_seconds=120)) as ws:
        ws.put(
            b"from setuptools import setup\nsetup(name='hybtestpkg', version='1.0', py_modules=['hybtestpkg'])\n",
            "pkg/setup.py",
        )
        ws.put(b"VALUE = 42\n", "pkg/hybtestpkg.py")
        install = ws.exec(
            "python3 -m pip install -q --no-index --no-build-isolation --target .deps ./pkg"
        )
        assert install.ok, install
        ws.put(os.urandom(4096), "data/blob.bin")
        assert ws.exec(
            "mkdir -p a/b && echo nested > a/b/c.txt && printf '#!/bin/sh\\necho run\\n' > tool.sh && chmod 755 tool.sh"
        ).ok
        before = ws.exec(["python3", "-c", HASH_TREE])
        assert before.ok and "./data/blob.bin" in before.stdout

        snapshot = ws.snapshot(f"test-{ws.name}")
        try:
            with engine.start(snapshot.name) as restored:
                after = restored.exec(["python3", "-c", HASH_TREE])
                assert after.stdout == before.stdout
                imported = restored.exec(
                    [
                        "python3",
                        "-c",
                        "import sys; sys.path.insert(0, '.deps'); import hybtestpkg; print(hybtestpkg.VALUE)",
                    ]
                )
                assert imported.stdout == "42\n", imported
                assert restored.exec("./tool.sh").stdout == "run\n"
                assert restored.spec == ws.spec
            forks = ws.fork(2)
            try:
                assert forks[0].exec("echo one > a/b/c.txt").ok
                assert forks[1].exec("cat a/b/c.txt").stdout == "nested\n"
                assert forks[0].exec("cat a/b/c.txt").stdout == "one\n"
            finally:
                for fork in forks:
                    fork.remove()
        finally:
            engine.remove_snapshot(snapshot.name)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def test_diff_round_trips(engine, tier, make_spec, tmp_path):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "app.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "README.md").write_text("# demo\n")
    (repo / "old.txt").write_text("to be deleted\n")
    (repo / "logo.bin").write_bytes(bytes(range(256)))
    (repo / ".gitignore").write_text("build/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    (repo / "README.md").write_text("# demo\nuncommitted but part of the copy\n")
    original = tmp_path / "original"
    subprocess.run(["cp", "-a", str(repo), str(original)], check=True)

    with engine.create(make_spec(tier), repo=repo) as ws:
        assert ws.diff() == ""
        status = ws.exec("git status --porcelain")
        assert status.ok and status.stdout == " M README.md\n", status  # the copy's own state
        edit = (
            "sed -i 's/a + b/a + b  # checked/' src/app.py && rm old.txt && "
            "mkdir -p pkg && echo 'x = 1' > pkg/new.py && "
            "printf '\\001\\002\\377' > logo.bin && mkdir -p build && echo junk > build/out.o"
        )
        assert ws.exec(edit).ok
        patch = ws.diff()
        assert "src/app.py" in patch and "old.txt" in patch and "pkg/new.py" in patch
        assert "build/out.o" not in patch and ".hybrid" not in patch
        inside = ws.exec(
            [
                "python3",
                "-c",
                HASH_TREE.replace('d != ".hybrid"', 'd not in (".hybrid", ".git", "build")'),
            ]
        )

    (tmp_path / "agent.patch").write_text(patch)
    subprocess.run(
        ["git", "-C", str(original), "apply", "--binary", str(tmp_path / "agent.patch")], check=True
    )
    outside = subprocess.run(
        [
            sys.executable,
            "-c",
            HASH_TREE.replace('d != ".hybrid"', 'd not in (".hybrid", ".git", "build")'),
        ],
        cwd=original,
        capture_output=True,
        text=True,
        check=True,
    )
    assert outside.stdout == inside.stdout
