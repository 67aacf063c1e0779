"""What a killed process leaves on the host (wasm scratch and /dev/shm I/O directories) is named
for its owner and reaped by the next process's first run; a live owner's directories never are.
Real processes, killed with SIGKILL mid-run under real wasmtime."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from poll_kit import wait_for

from hybrid import owner

VICTIM = textwrap.dedent(
    """
    import sys, threading, time
    from hybrid.policy import Budget, SandboxSpec
    from hybrid.wasm import run

    spec = SandboxSpec(tier="wasm", budget=Budget(fuel=10**13, wall_seconds=120))
    threading.Thread(target=run, args=(sys.argv[1], ["spin", ""]), kwargs={"spec": spec},
                     daemon=True).start()
    time.sleep(120)
    """
)

NEXT_RUN = textwrap.dedent(
    """
    import sys, time
    from hybrid.policy import Budget, SandboxSpec
    from hybrid.wasm import run

    result = run(sys.argv[1], ["spin", ""], spec=SandboxSpec(tier="wasm", budget=Budget(fuel=10**6)))
    assert result.termination == "out_of_fuel", result
    time.sleep(1)  # the reaper runs on a background thread: let it finish before exit
    """
)


def _marked(root: Path, prefix: str, pid: int) -> list[Path]:
    return sorted(root.glob(f"{prefix}{pid}-*"))


def test_a_killed_runs_directories_are_reaped_by_the_next_process(probe: Path, tmp_path: Path):
    from hybrid.wasm.runtime import scratch_capped

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    shm = Path(owner.SHM)
    # A capped scratch is a detached tmpfs: no path, and the kernel frees it with its process.
    capped = scratch_capped()
    assert shm.is_dir() or not capped, "nothing of the run would be on disk to reap"
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, str(probe)], env=env)
    try:
        # The run is under way once its directories exist.
        assert wait_for(
            lambda: (
                (capped or _marked(tmp_path, "hybrid-run-", victim.pid))
                and (not shm.is_dir() or _marked(shm, "hybrid-io-", victim.pid))
            ),
            60,
        ), "the victim's run never started"
    finally:
        victim.kill()
        victim.wait(30)
    left = _marked(tmp_path, "hybrid-run-", victim.pid) + _marked(shm, "hybrid-io-", victim.pid)
    assert left, "SIGKILL leaves the run's directories (nothing could remove them)"

    subprocess.run([sys.executable, "-c", NEXT_RUN, str(probe)], env=env, check=True, timeout=120)
    assert [p for p in left if p.exists()] == [], "the next process did not reap them"
    assert list(tmp_path.glob("hybrid-run-*")) == [], "the next process left its own scratch"


def test_reaping_spares_live_owners_and_unmarked_names(tmp_path: Path):
    mine = owner.make_dir("hybrid-run-", str(tmp_path))
    unmarked = tmp_path / "hybrid-run-abc123"  # an older release's name: owner unknown, kept
    unmarked.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    dead_pid = int(done.stdout)
    dead = tmp_path / f"hybrid-io-{dead_pid}-{owner.start_time(os.getpid())}-x"
    dead.mkdir()
    (dead / "stdout").write_bytes(b"left behind")
    # A recycled pid: alive now, but not the process that made the directory.
    recycled = tmp_path / f"hybrid-py-{os.getpid()}-1-x"
    recycled.mkdir()

    removed = owner.reap([str(tmp_path)])

    assert sorted(removed) == sorted([dead, recycled])
    assert mine.is_dir() and unmarked.is_dir()
    assert not dead.exists() and not recycled.exists()


def test_every_owner_mark_form_is_read_alike():
    """mark(), the directory backends' older `pid:start` and the engine labels' `host:pid:start`
    name the same live process; a dead pid, a wrong start time or a malformed mark names none."""
    import socket

    pid = os.getpid()
    started = owner.start_time(pid)
    for mark in (owner.mark(), f"{pid}:{started}", f"{socket.gethostname()}:{pid}:{started}"):
        assert owner.mark_alive(mark), mark
    assert owner.mark_alive(f"some-other-host:{pid}:0")  # another host's owner: assumed alive
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for mark in (f"{dead}-{started}", f"{pid}-0", f"{pid}:", "", "x:y", f"{pid}-?"):
        assert not owner.mark_alive(mark), mark
