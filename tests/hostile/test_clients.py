"""Attacks on the client: a reader that goes away, a client killed by SIGTERM and by SIGKILL.

Each runs the real CLI as a child process. Whatever the client leaves must stop on its own budget
(the deadline holds without the client) and be gone after the case: a SIGTERM cleans up like
Ctrl-C; after a SIGKILL the next run's start reaps it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hostile_kit import (
    CONTAINER_TIERS,
    Attack,
    Driver,
    Row,
    WorkstationDriver,
    containers_of,
    hybrid_cli,
    jobs_of,
)
from poll_kit import wait_for

from hybrid import owner

pytestmark = pytest.mark.timeout(300)

COUNT_YES = (
    "python3 -c \"import glob; print(sum(open(p, 'rb').read().startswith(b'yes') "
    "for p in glob.glob('/proc/[0-9]*/cmdline')))\""
)


@pytest.mark.parametrize("reader", ["prompt", "late"])
def test_closed_reader(sandbox: Driver, row: Row, reader: str) -> None:
    """`hybrid ... | head -1`: the client and the sandbox stop promptly, without a traceback.

    A ``late`` reader comes after the client has written all the output its cap lets through:
    where the cap fits in the pipe (the session workstation's 64k), no write blocks and none
    fails after it, so the client must see the reader go without writing."""
    attack = Attack(wasi=["flood", ""], python="while True:\n    print('y' * 100)\n", shell="yes")
    deadline = 30.0
    started = time.monotonic()
    child = hybrid_cli(sandbox.cli(attack, wall_seconds=deadline))
    assert child.stdout is not None and child.stderr is not None
    if reader == "late":
        time.sleep(3)
    first = child.stdout.readline()
    child.stdout.close()
    try:
        child.wait(timeout=deadline / 2)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail("the client kept running after its reader went away")
    elapsed = time.monotonic() - started
    err = child.communicate()[1].decode(errors="replace")
    row.note(f"client exit {child.returncode}")
    assert first, err
    assert not client_traceback(err), err
    assert elapsed < deadline / 2
    if isinstance(sandbox, WorkstationDriver):
        left = wait_for(lambda: sandbox.ws.exec(COUNT_YES).stdout.strip() == "0", 5)
        assert left, "`yes` still runs in the workstation after its reader went away"


def _started(sandbox: Driver, child: subprocess.Popen[bytes], ws: Any, tmp: Path) -> bool:
    """Whether the spinning job is running inside its sandbox yet."""
    if isinstance(sandbox, WorkstationDriver):
        return bool(ws.exec("cat .spin-pid 2>/dev/null; true").stdout.strip())
    if sandbox.tier in CONTAINER_TIERS:
        return "running" in containers_of(child.pid).values()
    if sandbox.kind == "process":  # a tier this suite knows nothing of: give it time to start
        time.sleep(2)
        return True
    # In process: the client (or its python-wasm worker) made its run's directories: scratch in
    # the suite's TMPDIR (a capped wasm scratch is a detached tmpfs with no path), I/O in /dev/shm.
    since = Path(f"/proc/{child.pid}").stat().st_ctime
    made = [*tmp.glob("hybrid-*"), *Path(owner.SHM).glob(f"hybrid-io-{child.pid}-*")]
    return any(p.stat().st_ctime >= since for p in made)


def client_traceback(err: str) -> bool:
    """A traceback of the client itself (a guest's own traceback names only its own files)."""
    return bool(re.search(r'File "[^"<]*/(hybrid|click|site-packages|python3\.\d+)/', err))


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_killed_client(sandbox: Driver, signal_name: str, row: Row, hostile_tmp: Path) -> None:
    spin = Attack(
        wasi=["spin", ""],
        python="while True:\n    pass\n",
        shell="echo $$ > .spin-pid; while :; do :; done",
    )
    deadline = 4.0
    with contextlib.ExitStack() as stack:
        ws = None
        extra: dict[str, Any] = {}
        if isinstance(sandbox, WorkstationDriver):
            ws = stack.enter_context(sandbox.fresh())
            extra["name"] = ws.name
        child = hybrid_cli(sandbox.cli(spin, wall_seconds=deadline, **extra))
        started = time.monotonic()
        assert wait_for(lambda: _started(sandbox, child, ws, hostile_tmp), 60), "never started"
        time.sleep(0.5)
        os.kill(child.pid, getattr(signal, signal_name))
        child.wait(timeout=30)
        _, raw = child.communicate()
        err = raw.decode(errors="replace")
        row.note(f"client {signal_name}: exit {child.returncode}")
        if signal_name == "SIGTERM":
            assert not client_traceback(err), err

        # The deadline holds without the client: nothing spins past it.
        remaining = deadline + sandbox.slack - (time.monotonic() - started)
        if isinstance(sandbox, WorkstationDriver):
            probe = 'test -d /proc/"$(cat .spin-pid)" && echo alive || echo gone'
            gone = wait_for(lambda: ws.exec(probe).stdout.strip() == "gone", remaining)
            assert gone, "the job outlived its deadline after the client died"
        elif sandbox.tier in CONTAINER_TIERS:
            stopped = wait_for(lambda: not jobs_of(child.pid), max(remaining, 1))
            assert stopped, f"the job outlived its deadline: {jobs_of(child.pid)}"

        if signal_name == "SIGKILL" and not isinstance(sandbox, WorkstationDriver):
            # What a killed client leaves is reaped when the next run starts.
            nothing = Attack(wasi=["print", "next"], python="print('next')", shell="echo next")
            following = hybrid_cli(sandbox.cli(nothing))
            _, raw = following.communicate(timeout=120)
            assert following.returncode == 0, raw.decode(errors="replace")
