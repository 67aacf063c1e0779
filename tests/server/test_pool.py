"""The warm sandbox pool: `hybrid run --tier docker|gvisor` through the server takes a
pre-created hardened sandbox, uses it once and has it destroyed; nothing one job leaves is seen
by the next; a killed server leaves nothing once the reaper has run."""

from __future__ import annotations

import os
import secrets
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_kit import Server, gone, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow]

LEAVE = (
    "echo {token} > /workspace/left; echo {token} > /tmp/left; "
    "(sleep 300 {token} >/dev/null 2>&1 &); echo started"
)
LOOK = (
    'python3 -c "import os\n'
    "for p in os.listdir('/proc'):\n"
    "    if p.isdigit():\n"
    "        try: print(open(f'/proc/{p}/cmdline','rb').read().replace(b'\\\\0', b' ').decode())\n"
    '        except OSError: pass\n"; '
    "ls -A /workspace /tmp; cat /workspace/left /tmp/left 2>&1; echo looked"
)


def owned_by(api: Any, pid: int) -> list[dict[str, Any]]:
    """Containers whose owner label names process ``pid`` on this host."""
    prefix = f"{socket.gethostname()}:{pid}:"
    return [
        row
        for row in api.containers(all=True, filters={"label": "hybrid.owner"})
        if (row.get("Labels") or {}).get("hybrid.owner", "").startswith(prefix)
    ]


def volumes_owned_by(api: Any, pid: int) -> list[str]:
    prefix = f"{socket.gethostname()}:{pid}:"
    found = api.volumes(filters={"label": "hybrid.owner"}).get("Volumes") or []
    return [
        v["Name"]
        for v in found
        if (v.get("Labels") or {}).get("hybrid.owner", "").startswith(prefix)
    ]


def ready(server: Server, tier: str) -> int:
    pool = (server.status() or {}).get("pool") or {}
    return sum(k["ready"] for k in pool.get("keys", []) if k["tier"] == tier)


@pytest.fixture(params=["docker", "gvisor"])
def pooled(
    request: pytest.FixtureRequest, require_runtime: Any, tmp_path: Path
) -> Iterator[tuple[Server, str]]:
    tier = request.param
    require_runtime(tier)
    made = Server(tmp_path / "run", "--pool-warm", tier, "--workers", "1", "--idle", "600")
    made.start()
    try:
        wait_for(lambda: ready(made, tier) >= 1, 300, f"a ready {tier} sandbox")
        yield made, tier
    finally:
        pids = made.pids()
        made.stop()
        wait_for(lambda: all(gone(p) for p in pids), 120, "the server to exit")


def test_a_job_sees_nothing_of_the_previous_one(pooled: tuple[Server, str], engine: Any) -> None:
    from hybrid.workstation.docker import client

    server, tier = pooled
    api = client().api
    token = secrets.token_hex(8)
    first_pool = {row["Id"] for row in owned_by(api, server.info["pid"])}
    assert first_pool, "no pooled sandbox owned by the server"

    left = server.hybrid("run", "--tier", tier, "--", "sh", "-c", LEAVE.format(token=token))
    assert (left.returncode, left.stdout) == (0, "started\n"), left.stderr
    wait_for(lambda: ready(server, tier) >= 1, 300, "the pool to refill")
    looked = server.hybrid("run", "--tier", tier, "--", "sh", "-c", LOOK)
    assert looked.returncode == 0, looked.stderr
    assert looked.stdout.endswith("looked\n")
    assert token not in looked.stdout  # no file, no process of the first job
    assert "No such file" in looked.stdout

    status = server.status() or {}
    assert status["pool"]["hits"] >= 2, status  # both jobs ran in pooled sandboxes
    assert status["pool"]["slotted"] >= 2, status  # ... through the exec waiting in each
    # The sandbox the first job used is destroyed, not returned to the pool.
    wait_for(
        lambda: not first_pool & {row["Id"] for row in owned_by(api, server.info["pid"])},
        120,
        "the used sandbox to be destroyed",
    )


def test_a_killed_server_leaves_nothing_after_the_reaper(
    pooled: tuple[Server, str], engine: Any
) -> None:
    from hybrid.workstation import backend
    from hybrid.workstation.docker import client

    server, _ = pooled
    api = client().api
    daemon = int(server.info["pid"])
    assert owned_by(api, daemon)
    assert volumes_owned_by(api, daemon)
    pids = server.pids()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all(gone(p) for p in pids), 60, "the killed server")
    backend().reap()
    assert owned_by(api, daemon) == []
    assert volumes_owned_by(api, daemon) == []
