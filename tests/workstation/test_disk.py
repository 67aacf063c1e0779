"""Disk fills on the process tiers, run for real: each stops at budget.disk with disk_limit,
keeps what was written before, and leaves no image, mount or volume behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hybrid import Termination
from hybrid.workstation import disk

CAP = 64 * 1024**2
MOUNTINFO = Path("/proc/self/mountinfo")


def _image(ws) -> Path:  # type: ignore[no-untyped-def]
    return Path(ws._container.labels["hybrid.disk"]).parent / "disk.img"


def _leftovers(name: str) -> list[str]:
    """Images, mounts and volumes of workstation ``name`` still on the host."""
    from hybrid.workstation.docker import client

    volume = f"hybrid-{name}-workspace"
    left = [str(p) for p in disk.root().glob(f"{volume}*")]
    left += [line for line in MOUNTINFO.read_text().splitlines() if f"/{volume}/" in line]
    left += [v["Name"] for v in client().api.volumes(filters={"name": volume})["Volumes"] or []]
    return left


def test_dd_fill_stops_at_the_cap_and_keeps_earlier_files(engine, tier, make_spec):
    with engine.create(make_spec(tier, disk="64M")) as ws:
        result = ws.exec(
            "echo kept > keep.txt; echo before; dd if=/dev/zero of=big bs=1M count=500"
        )
        assert result.termination is Termination.DISK_LIMIT, result
        assert result.exit_code not in (None, 0)
        assert result.stdout == "before\n"
        assert "No space left on device" in result.stderr
        assert "budget.disk (--disk), now 64M" in result.detail
        after = ws.exec("cat keep.txt; wc -c < big")  # no stat: gVisor here fails statx
        kept, size = after.stdout.split()
        assert kept == "kept" and 40 * 1024**2 < int(size) <= CAP
        # The host holds no more than the cap for this workspace, whatever was asked for.
        assert os.stat(_image(ws)).st_blocks * 512 <= CAP
        # Deleting gives the room back, and the workstation goes on working.
        assert ws.exec("rm big && dd if=/dev/zero of=again bs=1M count=8 2>/dev/null").ok
        name = ws.name
    assert _leftovers(name) == []


def test_fallocate_past_the_cap_is_a_disk_limit(engine, tier, make_spec):
    with engine.create(make_spec(tier, disk="64M")) as ws:
        result = ws.exec("fallocate -l 1G big")
        assert result.termination is Termination.DISK_LIMIT, result
        assert "--disk" in result.detail


def test_many_small_files_stop_at_the_cap(engine, tier, make_spec):
    script = textwrap.dedent(
        """
        import sys
        n = 0
        try:
            while n < 200000:
                with open(f"f{n}", "wb") as f:
                    f.write(b"x" * 4096)
                n += 1
        except OSError as e:
            print(n, e.strerror, flush=True)
            sys.exit(1)
        print(n, "all written")
        """
    )
    with engine.create(make_spec(tier, disk="16M")) as ws:
        ws.put(script.encode(), "fill.py")
        result = ws.exec(["python3", "fill.py"], timeout=120)
        assert result.termination is Termination.DISK_LIMIT, result
        count, _, reason = result.stdout.strip().partition(" ")
        assert 1000 < int(count) < 5000 and "No space left" in reason, result.stdout


def _disk_mounts() -> set[str]:
    return {line for line in MOUNTINFO.read_text().splitlines() if str(disk.root()) in line}


def test_one_shot_run_stops_at_the_cap(engine, tier):
    before = set(disk.root().iterdir())
    mounted = _disk_mounts()
    proc = subprocess.run(
        [
            sys.executable, "-m", "hybrid", "run", "--tier", tier, "--disk", "32M", "--json",
            "--", "sh", "-c", "echo before; dd if=/dev/zero of=big bs=1M count=500",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    report = json.loads(proc.stdout)
    result = report["result"]
    assert result["termination"] == "disk_limit", result
    assert result["stdout"] == "before\n"
    assert "--disk" in result["detail"]
    assert proc.returncode != 0
    assert set(disk.root().iterdir()) == before  # image and mount removed with the run
    assert _disk_mounts() <= mounted


def test_snapshot_and_fork_keep_files_and_caps(engine, make_spec):
    with engine.create(make_spec("docker", disk="32M")) as ws:
        assert ws.exec("echo hello > note.txt").ok
        forks = ws.fork(1)
        try:
            fork = forks[0]
            got = fork.exec("cat note.txt; df -k . | tail -1")
            assert got.stdout.startswith("hello\n"), got
            assert int(got.stdout.split()[2]) < 40 * 1024  # KiB: the fork's workspace is capped too
            filled = fork.exec("dd if=/dev/zero of=big bs=1M count=100")
            assert filled.termination is Termination.DISK_LIMIT
            assert ws.exec("cat note.txt").stdout == "hello\n"  # the source is untouched
            names = [ws.name, fork.name]
        finally:
            for made in forks:
                made.remove()
    for name in names:
        assert _leftovers(name) == []


def test_failed_create_leaves_no_image(engine, make_spec, tmp_path):
    from hybrid import WorkstationError
    from hybrid.policy import Mount

    spec = make_spec("docker").model_copy(
        update={"mounts": [Mount(source=tmp_path / "missing", target="/data")]}
    )
    before = set(disk.root().iterdir())
    with pytest.raises(WorkstationError):
        engine.create(spec, name=f"disk-fail-{os.getpid()}")
    assert set(disk.root().iterdir()) == before
    assert _leftovers(f"disk-fail-{os.getpid()}") == []


def test_gc_drops_the_image_of_a_killed_client(engine, tier, tmp_path):
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, signal
            from hybrid.workstation import backend
            from hybrid.policy import SandboxSpec
            ws = backend().create(SandboxSpec(tier={tier!r}, budget={{"disk": "32M"}}))
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
    assert _leftovers(name)  # the killed client left its image, mount and volume
    engine.gc()
    assert _leftovers(name) == []


def test_gc_drops_an_image_whose_volume_was_never_made(engine):
    """A client killed between formatting the image and creating the volume."""
    volume = f"hybrid-disk-orphan-{os.getpid()}-workspace"
    dead = f"{socket.gethostname()}:1:0"  # pid 1 did not start at tick 0: not alive
    disk.create(volume, 16 * 1024**2, dead, lambda owner: False)
    assert _leftovers(f"disk-orphan-{os.getpid()}")
    engine.gc()
    assert _leftovers(f"disk-orphan-{os.getpid()}") == []


def test_gc_removes_a_volume_the_engine_made_without_labels(engine, tmp_path):
    """The shape a create racing its own cleanup once left: the engine re-made the removed
    volume on its own (no labels) bound to the dead client's disk. gc removes it and the disk;
    an unlabelled volume of a live creator, or bound anywhere else, stays."""
    from hybrid.workstation.docker import client
    from hybrid.workstation.docker.labels import _owner

    api = client().api
    pid = os.getpid()
    dead, live = f"{socket.gethostname()}:1:0", _owner()
    names = {
        "dead": f"hybrid-nolabel-dead-{pid}-workspace",
        "live": f"hybrid-nolabel-live-{pid}-workspace",
        "elsewhere": f"hybrid-nolabel-else-{pid}-workspace",
    }
    mounts = {
        "dead": disk.create(names["dead"], 16 * 1024**2, dead, lambda owner: False),
        "live": disk.create(names["live"], 16 * 1024**2, live, lambda owner: True),
        "elsewhere": tmp_path / "workspaces" / "x" / "mnt",
    }
    try:
        for key, name in names.items():
            api.create_volume(name, driver="local", driver_opts=disk.volume_options(mounts[key]))
        report = engine.gc()
        assert names["dead"] in report.volumes
        assert _leftovers(f"nolabel-dead-{pid}") == []
        kept = {v["Name"] for v in api.volumes()["Volumes"] or []}
        assert {names["live"], names["elsewhere"]} <= kept
        assert os.path.ismount(mounts["live"])
    finally:
        for name in names.values():
            with contextlib.suppress(Exception):
                api.remove_volume(name, force=True)
        disk.drop(mounts["live"])


def test_workspace_below_the_minimum_is_refused(engine, make_spec):
    from hybrid import InvalidInput

    with pytest.raises(InvalidInput, match=r"budget\.disk: 1M is below"):
        engine.create(make_spec("docker", disk="1M"))


def test_a_dead_creators_leftover_does_not_block_the_name(engine, make_spec):
    name = f"disk-again-{os.getpid()}"
    dead = f"{socket.gethostname()}:1:0"
    disk.create(f"hybrid-{name}-workspace", 16 * 1024**2, dead, lambda owner: False)
    with engine.create(make_spec("docker", disk="16M"), name=name) as ws:
        assert ws.exec("df -k . | tail -1").ok
    assert _leftovers(name) == []


def test_docker_gc_keeps_a_live_microvm_workspace(engine, microvm):
    """The workspace disks of every backend share one directory: the docker backend's gc must
    read the microvm backend's owner marks too (it read them as dead and unmounted the live
    workspace of a running microVM)."""
    with microvm.create() as ws:
        (ws.workspace_dir / "kept.txt").write_text("still here\n")
        engine.gc()
        assert os.path.ismount(ws.workspace_dir)
        assert ws.exec("cat /workspace/kept.txt").stdout == "still here\n"
