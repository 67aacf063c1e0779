"""Jobs run as a uid and gid no host account has, so no host account reaches a running job.

Jobs used to run as host uid 1000, the first login account of most machines: that account read an
``env.set`` secret from ``/proc/PID/environ`` of a running job and ``PTRACE_ATTACH``ed to it, on
the docker and bwrap tiers. Here a real account with uid 1000 (this machine's, or one the test
creates and removes) attacks a running job the same way, and the job's own ids are looked up in
the host's account databases.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile_kit import Attack, Driver, hybrid_cli

from hybrid import tiers
from hybrid.errors import EngineUnavailable, WorkstationError
from hybrid.policy import Environment
from hybrid.results import ExecutionResult
from hybrid.workstation import jobuser

pytestmark = pytest.mark.timeout(300)

OLD_UID = 1000
"""The uid jobs ran as before: a real account on this machine type."""
HOST_PROCESS_TIERS = ("bwrap", "docker", "workstation")
"""Tiers whose jobs are host processes (gVisor's and a microVM's live inside their own kernel)."""

IDS = """
import os
print("groups", *os.getgroups())
for line in open("/proc/self/status"):
    if line.startswith(("Uid:", "Gid:")):
        print(line.strip())
"""

ATTACK = """
import ctypes, os, sys
pid = int(sys.argv[1])
print("attacker", os.getuid(), os.getgid())
try:
    with open(f"/proc/{pid}/environ", "rb") as f:
        print("environ read", f.read())
except OSError as exc:
    print("environ refused", type(exc).__name__)
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
rc = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
print("ptrace", rc, ctypes.get_errno())
if rc == 0:
    os.waitpid(pid, 0)
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
"""


def _user(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _group(gid: int) -> str | None:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return None


def _subordinate(path: str, value: int) -> list[str]:
    owners = []
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            parts = line.split(":")
            numeric = len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit()
            if numeric and int(parts[1]) <= value < int(parts[1]) + int(parts[2]):
                owners.append(parts[0])
    return owners


def _process_tier(sandbox: Driver) -> None:
    if sandbox.kind in ("wasi", "python"):
        pytest.skip("runs inside this process: a job has no process and no uid of its own")


def test_job_ids_belong_to_no_host_account(sandbox: Driver) -> None:
    _process_tier(sandbox)
    result = sandbox.run(Attack(shell=f"python3 - <<'EOF'\n{IDS}\nEOF\n"), wall_seconds=30)
    assert result.ok, result
    lines = result.stdout.splitlines()
    uids = {int(v) for line in lines if line.startswith("Uid:") for v in line.split()[1:]}
    gids = {int(v) for line in lines if line.startswith("Gid:") for v in line.split()[1:]}
    gids |= {int(v) for line in lines if line.startswith("groups") for v in line.split()[1:]}
    assert uids and gids, result.stdout
    for uid in uids:
        assert _user(uid) is None, f"the job's uid {uid} is the host account {_user(uid)}"
        assert not _subordinate("/etc/subuid", uid), uid
    for gid in gids:
        assert _group(gid) is None, f"the job's gid {gid} is the host group {_group(gid)}"
        assert not _subordinate("/etc/subgid", gid), gid
    assert uids == {jobuser.JOB_UID} and gids == {jobuser.JOB_GID}, (uids, gids)
    # What doctor says of the tier: these ids, held by no account.
    found = tiers.get(sandbox.spec_tier).probe()
    assert found.available, found
    assert f"uid {jobuser.JOB_UID} gid {jobuser.JOB_GID}" in found.detail, found.detail
    assert "no host account" in found.detail, found.detail


@pytest.fixture(scope="module")
def old_account() -> Iterator[tuple[int, int]]:
    """A real host account with the uid jobs ran as: this machine's, or one made for the module
    (useradd) and removed after it."""
    if os.geteuid() != 0:
        pytest.skip("making and impersonating a host account needs root")
    with contextlib.suppress(KeyError):
        entry = pwd.getpwuid(OLD_UID)
        yield entry.pw_uid, entry.pw_gid
        return
    name = f"hyb{secrets.token_hex(4)}"
    made = subprocess.run(
        ["useradd", "--no-create-home", "--user-group", "--uid", str(OLD_UID), name],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:  # gid 1000 taken by a group: the account without its own group
        subprocess.run(
            ["useradd", "--no-create-home", "--no-user-group", "--uid", str(OLD_UID), name],
            check=True,
            capture_output=True,
        )
    try:
        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def _find(command: bytes, until: float) -> int | None:
    """The host pid whose command line is exactly ``command``, waiting until ``until``."""
    while time.monotonic() < until:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if (entry / "cmdline").read_bytes() == command:
                        return int(entry.name)
        time.sleep(0.1)
    return None


def test_host_account_cannot_read_or_trace_a_job(
    sandbox: Driver, old_account: tuple[int, int]
) -> None:
    _process_tier(sandbox)
    secret = f"job-secret-{secrets.token_hex(8)}"
    # A job that is no host process (gVisor, a microVM) is looked for while it runs, then ends on
    # its deadline; a host process is killed as soon as it has been attacked.
    host_process = sandbox.tier in HOST_PROCESS_TIERS
    spec = sandbox.spec(wall_seconds=60 if host_process else 20)
    spec = spec.model_copy(
        update={"env": Environment(allow=["JOB_VALUE"], set={"JOB_VALUE": secret})}
    )
    duration = f"{50 + secrets.randbelow(9)}.{secrets.randbelow(10**6):06d}"
    outcome: list[ExecutionResult | BaseException] = []

    def job() -> None:
        try:
            outcome.append(sandbox.run(Attack(shell=f"exec sleep {duration}"), spec=spec))
        except BaseException as exc:
            outcome.append(exc)

    runner = threading.Thread(target=job, daemon=True)
    runner.start()
    pid = _find(
        b"sleep\0" + duration.encode() + b"\0", time.monotonic() + (60 if host_process else 15)
    )
    try:
        if pid is None:
            assert not host_process, f"no host process for the job: {outcome}"
            return  # the job is no host process at all (gVisor's sentry, a microVM's guest)
        status = Path(f"/proc/{pid}/status").read_text()
        assert f"Uid:\t{jobuser.JOB_UID}\t" in status, status
        uid, gid = old_account
        attack = subprocess.run(
            [
                *("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"),
                *("/usr/bin/python3", "-c", ATTACK, str(pid)),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        report = attack.stdout + attack.stderr
        assert f"attacker {uid} {gid}" in report, report
        assert secret not in report, f"host uid {uid} read the job's environment: {report}"
        assert "environ refused PermissionError" in report, report
        assert "ptrace -1 1" in report, f"host uid {uid} could ptrace the job: {report}"
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        runner.join(120)
    assert not runner.is_alive()


def test_jobs_refuse_ids_a_host_account_has(
    sandbox: Driver, old_account: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ids a host account has (here the old 1000, set through HYBRID_JOB_UID) stop every process
    tier before anything runs, with one line; doctor says why; a docker backend told to run its
    jobs as that account refuses too."""
    _process_tier(sandbox)
    uid, gid = old_account
    monkeypatch.setenv("HYBRID_JOB_UID", str(uid))  # for the CLI children only: read at import
    monkeypatch.setenv("HYBRID_JOB_GID", str(gid))
    tier = sandbox.spec_tier
    run = hybrid_cli(["run", "--tier", tier, "--processes", "--", "/bin/sh", "-c", "echo ran"])
    out, err = run.communicate(timeout=180)
    lines = err.decode().strip().splitlines()
    assert run.returncode == EngineUnavailable.exit_code, (out, err)
    assert b"ran" not in out and len(lines) == 1 and f"uid {uid}" in lines[0], lines
    doctor = hybrid_cli(["doctor", "--json"])
    out, err = doctor.communicate(timeout=180)
    rows = {row["tier"]: row for row in json.loads(out)}
    assert not rows[tier]["available"] and f"uid {uid}" in rows[tier]["detail"], rows[tier]
    assert "HYBRID_JOB_UID" in rows[tier]["fix"], rows[tier]
    if tier in ("docker", "gvisor"):
        from hybrid.workstation.docker import DockerBackend

        with pytest.raises(WorkstationError, match=f"uid {uid}"):
            DockerBackend(user=f"{uid}:{gid}").create(sandbox.spec())
