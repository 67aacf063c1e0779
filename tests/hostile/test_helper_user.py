"""The containers that confine a workstation run as ids no host account has.

The egress relay, the proxy that enforces the allow-list and the holder of a namespace the
services share ran as uid 65534, the host's ``nobody``: a host process running as ``nobody``
read the proxy's environment (its allow and deny lists) from ``/proc/PID/environ`` and
``PTRACE_ATTACH``ed to it, so it could have rewritten what the proxy allows. Here a real process
running as ``nobody`` (setpriv) attacks each of them; their ids are looked up in the host's
account databases as the jobs' are (``jobuser.holders``).
"""

from __future__ import annotations

import contextlib
import pwd
import subprocess
from pathlib import Path

import pytest
from hostile_kit import Driver
from test_job_user import ATTACK

from hybrid.workstation import jobuser

pytestmark = pytest.mark.timeout(300)


def _attack_as_nobody(pid: int) -> str:
    nobody = pwd.getpwnam("nobody")
    attack = subprocess.run(
        [
            *("setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"),
            *("--", "/usr/bin/python3", "-c", ATTACK, str(pid)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return attack.stdout + attack.stderr


def _host_pid(api: object, container: str) -> int:
    pid = int(api.inspect_container(container)["State"]["Pid"])  # type: ignore[attr-defined]
    assert pid > 0, f"{container} is not running"
    return pid


def test_host_nobody_cannot_read_or_trace_the_egress_proxy(sandbox: Driver) -> None:
    if sandbox.tier != "workstation":
        pytest.skip("the egress proxy and namespace holders serve docker workstations")
    from hybrid.workstation.docker import client, services
    from hybrid.workstation.docker.labels import (
        LABEL_MANAGED,
        LABEL_NAME,
        LABEL_OWNER,
        LABEL_PERSISTENT,
        _owner,
    )

    assert not jobuser.holders(), f"the helpers' ids are held on this host: {jobuser.holders()}"
    name = sandbox.ws.name  # type: ignore[attr-defined]
    api = client().api
    # A namespace holder of this case's own (a workstation with services makes one).
    holder_labels = {
        LABEL_MANAGED: "1",
        LABEL_NAME: f"{name}-h",
        LABEL_OWNER: _owner(),
        LABEL_PERSISTENT: "0",
    }
    services.make_holder(holder_labels)
    holder = services.holder_name(holder_labels[LABEL_NAME])
    try:
        for container in (f"hybrid-{name}-proxy", f"hybrid-{name}-relay", holder):
            pid = _host_pid(api, container)
            status = Path(f"/proc/{pid}/status").read_text()
            uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
            assert int(uid) == jobuser.HELPER_UID, f"{container} runs as uid {uid}"
            with contextlib.suppress(KeyError):
                pytest.fail(f"{container}'s uid {uid} is the host user {pwd.getpwuid(int(uid))}")
            report = _attack_as_nobody(pid)
            assert "attacker 65534 65534" in report, report
            assert "environ read" not in report, f"nobody read {container}'s environment: {report}"
            assert "environ refused PermissionError" in report, report
            assert "ptrace -1 1" in report, f"nobody could ptrace {container}: {report}"
    finally:
        with contextlib.suppress(Exception):
            api.remove_container(holder, force=True)
