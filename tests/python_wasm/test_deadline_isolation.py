"""A python-wasm guest blocked in a host call must not outlive its deadline (real wasmtime).

The attack: the guest's harness keeps the real ``time.sleep``; calling it blocks in wasmtime's
own WASI poll, which epoch interruption cannot stop. The caller got a timeout on time, but the
guest held a thread and its output FIFOs for the full sleep, one more per run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hybrid.policy import Budget, SandboxSpec
from hybrid.results import Termination
from hybrid.wasm.python import run_python

STUCK = "import sys\nprint('before the sleep', flush=True)\nsys.modules['app']._real_sleep(30)\n"


def _spec(wall_seconds: float) -> SandboxSpec:
    return SandboxSpec(
        tier="python-wasm",
        budget=Budget(wall_seconds=wall_seconds, memory="256M", fuel=20_000_000_000),
    )


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _children() -> set[int]:
    found: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            text = Path(f"/proc/self/task/{task}/children").read_text()
        except OSError:
            continue
        found.update(int(pid) for pid in text.split())
    return found


def _stop(workers: set[int]) -> list[int]:
    # The run goes to one of the idle workers (the pool reuses them); stop them all at once.
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    return sorted(workers)


def _leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("hybrid-py-"))


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Workers started from here keep their scratch directories (and FIFOs) in ``tmp_path``."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def test_twenty_stuck_guests_leave_no_thread_fd_process_or_fifo(private_tmp: Path) -> None:
    assert run_python("print('warm')").ok
    time.sleep(0.5)
    threads, fds, children = _threads(), _fds(), _children()

    results = []
    lock = threading.Lock()

    def one() -> None:
        start = time.monotonic()
        result = run_python(STUCK, spec=_spec(1.0))
        with lock:
            results.append((result, time.monotonic() - start))

    callers = [threading.Thread(target=one) for _ in range(20)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(120)
    last_deadline = time.monotonic()
    assert len(results) == 20
    for result, elapsed in results:
        assert result.termination is Termination.TIMEOUT, result
        # 1 s deadline + 0.5 s backstop; the rest is slack for starting 20 workers on 2 cores.
        assert elapsed < 30, elapsed
    assert sum("before the sleep" in r.stdout for r, _ in results) >= 15  # partial output kept

    time.sleep(2.0)
    assert _threads() <= threads, "a guest still holds a thread"
    assert _fds() <= fds, f"descriptors left: {sorted(os.listdir('/proc/self/fd'))}"
    assert _children() <= children, "a worker holding a stuck guest still runs"
    assert _leftovers(private_tmp) == [], "a stuck guest's scratch directory (FIFOs) was left"
    assert time.monotonic() - last_deadline < 10


def test_partial_output_and_a_fresh_worker_after_a_stuck_guest(private_tmp: Path) -> None:
    result = run_python(STUCK, spec=_spec(0.5))
    assert result.termination is Termination.TIMEOUT
    assert result.stdout == "before the sleep\n" and "host call" in result.detail
    after = run_python("print(6 * 7)")
    assert after.ok and after.stdout == "42\n"


def test_an_unresponsive_worker_is_killed_after_the_grace(private_tmp: Path) -> None:
    """A worker that cannot even report the timeout (stopped here) is killed by the parent."""
    assert run_python("pass").ok
    before = _children()
    stopped: list[int] = []
    stopper = threading.Thread(target=lambda: stopped.extend(_stop(before)))
    start = time.monotonic()
    stopper.start()
    try:
        result = run_python("import time\ntime.sleep(0.3)\nprint('late')", spec=_spec(0.5))
    finally:
        stopper.join()
        for pid in stopped:  # idle workers this run did not take go on serving
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    elapsed = time.monotonic() - start
    assert stopped
    assert result.termination is Termination.TIMEOUT, result
    assert "killed" in result.detail
    assert elapsed < 10
    time.sleep(0.5)
    assert _children() < before  # the one that ran is gone
    assert _leftovers(private_tmp) == []


def test_a_killed_caller_leaves_no_worker_or_scratch(private_tmp: Path) -> None:
    """SIGKILL to the caller while its guest is blocked: the worker and its files go too."""
    caller = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from hybrid.wasm.python import run_python; from hybrid.policy import *; "
            "run_python(\"import sys; sys.modules['app']._real_sleep(60)\", "
            "spec=SandboxSpec(tier='python-wasm', budget=Budget(wall_seconds=60)))",
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        workers: set[int] = set()
        end = time.monotonic() + 120
        while not (workers and _leftovers(private_tmp)) and time.monotonic() < end:
            assert caller.poll() is None
            workers = _children_of(caller.pid)
            time.sleep(0.2)
        assert workers and _leftovers(private_tmp), "the worker never started its guest"
        time.sleep(1.0)  # the guest is in its sleep now
    finally:
        caller.kill()
        caller.wait()
    end = time.monotonic() + 5
    while time.monotonic() < end and (_alive(workers) or _leftovers(private_tmp)):
        time.sleep(0.1)
    assert not _alive(workers), "the worker outlived its caller"
    assert _leftovers(private_tmp) == []


def _children_of(pid: int) -> set[int]:
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        with contextlib.suppress(OSError):
            found.update(
                int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
            )
    return found


def _alive(pids: set[int]) -> bool:
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            return True
    return False
