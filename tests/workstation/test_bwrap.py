"""The bwrap tier's own containment, on real bubblewrap (a failure under HYBRID_REQUIRE_ENGINE=1
when bwrap, root or cgroups are missing): the seccomp filter, the namespaces, the deadline
killing a whole process tree, secrets kept off command lines, and what a killed client leaves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid.policy import Budget, SandboxSpec
from hybrid.results import Termination
from hybrid.workstation.jobuser import JOB_GID, JOB_UID

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]


def spec(**budget: object) -> SandboxSpec:
    values: dict[str, object] = {"wall_seconds": 30, "memory": "256M", "pids": 64}
    values.update(budget)
    return SandboxSpec(tier="bwrap", budget=Budget.model_validate(values))


SYSCALLS = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, call):
    ctypes.set_errno(0)
    rc = call()
    print(name, "ALLOWED" if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), "?"))
attempt("ptrace_traceme", lambda: libc.ptrace(0, 0, None, None))
attempt("mount", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
attempt("umount2", lambda: libc.umount2(b"/proc", 2))
attempt("unshare_user", lambda: libc.unshare(0x10000000))
attempt("clone_newuser", lambda: libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0))
attempt("bpf", lambda: libc.syscall(321, 0, None, 0))
attempt("perf_event_open", lambda: libc.syscall(298, None, 0, -1, -1, 0))
attempt("keyctl", lambda: libc.syscall(250, 0, 0, 0, 0, 0))
attempt("add_key", lambda: libc.syscall(248, b"user", b"k", b"v", 1, -2))
attempt("userfaultfd", lambda: libc.syscall(323, 0))
attempt("open_by_handle_at", lambda: libc.syscall(304, -100, None, 0))
attempt("kexec_load", lambda: libc.syscall(246, 0, 0, None, 0))
attempt("init_module", lambda: libc.syscall(175, None, 0, b""))
attempt("delete_module", lambda: libc.syscall(176, b"loop", 0))
attempt("io_uring_setup", lambda: libc.syscall(425, 1, None))
"""


def test_seccomp_denies_kernel_interfaces_and_allows_toolchains(bwrap_backend):
    with bwrap_backend.create(spec()) as ws:
        denied = ws.exec(["python3", "-c", SYSCALLS])
        lines = dict(line.split(" ", 1) for line in denied.stdout.splitlines())
        assert len(lines) == 15, denied
        assert all(v in ("EPERM", "ENOSYS") for v in lines.values()), lines
        status = ws.exec("grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status").stdout
        assert "Seccomp:\t2" in status and "NoNewPrivs:\t1" in status, status
        # What a test runner needs: fork, threads, subprocesses, pipes, a real pytest run.
        ws.put(b"import threading, subprocess\n"
               b"def test_work():\n"
               b"    t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
               b"    assert subprocess.run(['sh', '-c', 'echo ok | cat'], capture_output=True).stdout == b'ok\\n'\n",
               "test_it.py")  # fmt: skip
        ran = ws.exec("python3 -m pytest -q -p no:cacheprovider test_it.py")
        assert ran.ok and "1 passed" in ran.stdout, ran


def test_namespaces_user_and_environment(bwrap_backend, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HYBRID_BWRAP_CANARY", "host-value")
    secret = "s3cret-" + os.urandom(6).hex()
    limited = SandboxSpec.model_validate(
        {**spec().model_dump(), "env": {"allow": ["TOKEN_X"], "set": {"TOKEN_X": secret}}}
    )
    with bwrap_backend.create(limited) as ws:
        script = (
            "hostname; id -u; id -g; cat /proc/1/cmdline | tr '\\0' ' '; echo; "
            "ls /sys/class/net 2>/dev/null || cat /proc/net/dev | tail -n +3 | cut -d: -f1; "
            "env | sort; sleep 2 & sleep 0.2; echo done"
        )
        seen: list[str] = []

        def watch() -> None:
            # While it runs, no host process's command line carries the secret value.
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    if secret.encode() in cmdline.read_bytes():
                        seen.append(str(cmdline))
                except OSError:
                    pass

        result = ws.exec(script, on_output=lambda kind, chunk: watch())
        lines = result.stdout.split("\n")
        assert lines[0] == "sandbox" and lines[1:3] == [str(JOB_UID), str(JOB_GID)], lines
        assert lines[3].startswith("bwrap"), lines  # pid 1 is the sandbox's own init
        assert [n.strip() for n in lines[4:5]] == ["lo"], lines
        assert f"TOKEN_X={secret}" in result.stdout
        assert "HYBRID_BWRAP_CANARY" not in result.stdout, "a host variable leaked"
        assert seen == [], f"the secret value is on a command line: {seen}"


def test_deadline_kills_a_tree_that_ignores_sigterm(bwrap_backend):
    tree = (
        "trap '' TERM HUP INT; "
        "for i in 1 2 3 4 5; do (trap '' TERM; setsid sh -c 'trap \"\" TERM; sleep 300' &) ; done; "
        "while :; do sleep 0.1; done"
    )
    with bwrap_backend.create(spec(pids=128)) as ws:
        started = time.monotonic()
        result = ws.exec(tree, timeout=2)
        assert result.termination is Termination.TIMEOUT, result
        assert time.monotonic() - started < 12
        group = ws._group()
        end = time.monotonic() + 5
        while group.pids() and time.monotonic() < end:
            time.sleep(0.05)
        assert group.pids() == set(), "processes of the timed-out exec outlived its deadline"
        assert ws.exec("echo alive").stdout == "alive\n"  # the workstation itself stays usable


def test_probe_says_what_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from hybrid.tiers.bwrap import BWRAP

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    found = BWRAP.probe()
    assert not found.available and "bubblewrap" in found.detail and "apt-get" in found.fix
    monkeypatch.undo()
    from hybrid.workstation.bwrap import cgroups

    monkeypatch.setattr(cgroups, "ROOT", tmp_path)  # no controller here
    found = BWRAP.probe()
    assert not found.available and "cgroup" in found.detail, found


def test_killed_client_leaves_nothing(bwrap_backend, tmp_path: Path):
    from hybrid.workstation.bwrap import cgroups, workspace

    marker = "hybrid-bwrap-marker-" + os.urandom(4).hex()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before_ws = set(os.listdir(workspace.base() / "ws"))
    before_cg = set(cgroups.existing())
    client = subprocess.Popen(
        [sys.executable, "-m", "hybrid", "run", "--tier", "bwrap", "--timeout", "120", "--",
         "sh", "-c", f"sleep 300 & exec -a {marker} sleep 300"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def running() -> bool:
        return any(
            marker.encode() in p.read_bytes()
            for p in Path("/proc").glob("[0-9]*/cmdline")
            if p.exists() and os.access(p, os.R_OK)
        )

    end = time.monotonic() + 60
    while not running() and time.monotonic() < end:
        time.sleep(0.1)
    assert running(), "the sandbox never started"
    os.kill(client.pid, signal.SIGKILL)
    client.wait()
    end = time.monotonic() + 10
    while running() and time.monotonic() < end:
        time.sleep(0.1)
    assert not running(), "the sandbox outlived its killed client"
    # Its workspace and cgroup are reaped by the next run.
    following = subprocess.run(
        [sys.executable, "-m", "hybrid", "run", "--tier", "bwrap", "--", "true"],
        env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert following.returncode == 0, following.stderr
    assert set(os.listdir(workspace.base() / "ws")) <= before_ws
    assert set(cgroups.existing()) <= before_cg
