"""python-wasm leftovers of killed processes: a killed runner's directory is reaped by the next
process's first run, and a PythonPool whose parent is killed takes its workers (and their
directories) with it. Real processes, real wasmtime, SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from poll_kit import wait_for

from hybrid.wasm.python import run_python

VICTIM = textwrap.dedent(
    """
    import threading, time
    from hybrid.policy import Budget, SandboxSpec
    from hybrid.wasm.python import run_python

    spec = SandboxSpec(tier="python-wasm", budget=Budget(wall_seconds=120, fuel=10**13))
    threading.Thread(target=run_python, args=("while True: pass",), kwargs={"spec": spec},
                     daemon=True).start()
    time.sleep(120)
    """
)

NEXT_RUN = textwrap.dedent(
    """
    import os, sys, time
    from hybrid.wasm.python import run_python

    assert run_python("print(1)").stdout == "1\\n"
    # The reaper runs on a background thread of the worker: stay (and keep the worker) until
    # the dead owners' directories are gone, or 30 s.
    end = time.time() + 30
    while time.time() < end and any(os.path.exists(p) for p in sys.argv[1:]):
        time.sleep(0.1)
    """
)

POOL_PARENT = textwrap.dedent(
    """
    import time
    from hybrid.wasm.python.pool import PythonPool

    if __name__ == "__main__":
        pool = PythonPool(2)
        assert [f.result().stdout for f in [pool.submit("print(2)") for _ in range(4)]] == ["2\\n"] * 4
        print(*pool._executor._processes, flush=True)
        time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").is_dir() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


@pytest.fixture(scope="module", autouse=True)
def compiled() -> None:
    """Compile the guest once into the session's cache, so the child processes only load it."""
    assert run_python("pass").ok


def _owners(root: Path) -> set[int]:
    """Pids that own hybrid-py-<pid>-<start>-* directories under ``root``."""
    return {int(p.name.split("-")[2]) for p in root.glob("hybrid-py-*")}


def test_a_killed_runners_directory_is_reaped_by_the_next_process(tmp_path: Path):
    """Guests run in worker processes (isolation.py): SIGKILL the one running a guest, and its
    caller, so nothing of theirs could clean up; the next process's first run reaps the rest."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    victim = subprocess.Popen([sys.executable, "-c", VICTIM], env=env)
    runners: set[int] = set()
    try:
        assert wait_for(lambda: any(tmp_path.glob("hybrid-py-*/*-stdout")), 120), (
            "the victim's run never started"
        )
        runners = _owners(tmp_path)
        for pid in runners:
            os.kill(pid, signal.SIGKILL)
    finally:
        victim.kill()
        victim.wait(30)
    assert wait_for(lambda: not any(_alive(pid) for pid in runners), 30)
    left = list(tmp_path.glob("hybrid-py-*"))
    assert left, "SIGKILL leaves the runner's directory (its pipes included)"

    subprocess.run(
        [sys.executable, "-c", NEXT_RUN, *map(str, left)], env=env, check=True, timeout=180
    )
    assert [p for p in left if p.exists()] == [], "the next process did not reap it"


def test_a_pool_whose_parent_is_killed_takes_its_workers_and_their_directories(tmp_path: Path):
    script = tmp_path / "parent.py"  # spawn re-imports the parent's main module by path
    script.write_text(POOL_PARENT)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    parent = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True
    )
    workers: list[int] = []
    try:
        assert parent.stdout is not None
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(workers) == 2, "the pool never started"
        # Each pool worker runs its guests in a guest worker of its own (isolation.py).
        assert wait_for(lambda: len(_owners(tmp_path)) >= 2, 30)
        workers += sorted(_owners(tmp_path))
    finally:
        parent.kill()
        parent.wait(30)
    try:
        assert wait_for(lambda: not any(_alive(pid) for pid in workers), 30), (
            "the pool's workers outlived their killed parent"
        )
        assert list(tmp_path.glob("hybrid-py-*")) == [], "the workers' directories were left"
    finally:
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
