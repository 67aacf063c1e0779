"""Resource limits for the bwrap tier: one cgroup per workstation, v1 or v2.

bubblewrap has no limits of its own. Each workstation gets ``hybrid-bwrap-<id>`` under every
controller it needs (v1: ``/sys/fs/cgroup/{memory,pids,cpu}/``; v2: one directory in the
unified hierarchy). A command joins it before bwrap starts (so every process of the sandbox is
counted), and ``kill`` ends every process in it, whatever pid namespace they are in.
The ``hybrid-`` prefix is what the hostile suite's leftover check looks for.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from hybrid.errors import EngineUnavailable

ROOT = Path(os.environ.get("HYBRID_CGROUP_ROOT", "/sys/fs/cgroup"))
PREFIX = "hybrid-bwrap-"
_V1 = ("memory", "pids", "cpu")
_PERIOD_US = 100_000


@dataclass(frozen=True)
class Layout:
    """Where this host keeps the controllers: v1 (one mount each) or v2 (one hierarchy)."""

    version: int
    bases: tuple[Path, ...]  # v1: memory, pids, cpu mounts; v2: the parent directory


def layout() -> Layout:
    """The controllers this host has, or EngineUnavailable saying what is missing."""
    if (ROOT / "cgroup.controllers").is_file():
        enabled = set((ROOT / "cgroup.controllers").read_text().split())
        missing = [c for c in _V1 if c not in enabled]
        if missing:
            raise EngineUnavailable(
                f"cgroup v2 at {ROOT} lacks the {', '.join(missing)} controller(s)"
            )
        return Layout(2, (ROOT,))
    bases = tuple(ROOT / c for c in _V1)
    missing = [b.name for b in bases if not (b / "cgroup.procs").is_file()]
    if missing:
        raise EngineUnavailable(
            f"no cgroup v1 {', '.join(missing)} controller under {ROOT} and no cgroup v2 there"
        )
    return Layout(1, bases)


def problem() -> str | None:
    """Why this process cannot make limited cgroups here (None: it can)."""
    try:
        found = layout()
    except EngineUnavailable as exc:
        return exc.message
    for base in found.bases:
        if not os.access(base, os.W_OK):
            return (
                f"{base} is not writable by uid {os.geteuid()} (run as root, or delegate it: "
                f"chown it to this user, or point HYBRID_CGROUP_ROOT at a delegated cgroup)"
            )
    if found.version == 2:
        wanted = {"memory", "pids", "cpu"}
        control = set((found.bases[0] / "cgroup.subtree_control").read_text().split())
        if not wanted <= control and not os.access(
            found.bases[0] / "cgroup.subtree_control", os.W_OK
        ):
            return f"{found.bases[0]} does not hand memory, pids and cpu to its children"
    return None


class Group:
    """One workstation's cgroup (in every controller directory of the layout)."""

    def __init__(self, name: str, found: Layout | None = None) -> None:
        self.layout = found or layout()
        self.name = name
        self.dirs = tuple(base / name for base in self.layout.bases)

    @classmethod
    def create(cls, name: str, memory: int, pids: int, cpus: float) -> Group:
        """Make it with these limits; EngineUnavailable when this host cannot."""
        why = problem()
        if why:
            raise EngineUnavailable(f"the bwrap tier needs cgroups: {why}")
        group = cls(name)
        try:
            if group.layout.version == 2:
                control = group.layout.bases[0] / "cgroup.subtree_control"
                if not {"memory", "pids", "cpu"} <= set(control.read_text().split()):
                    control.write_text("+memory +pids +cpu")
            for d in group.dirs:
                d.mkdir()
            group._limit(memory, pids, cpus)
        except BaseException:
            group.remove()
            raise
        return group

    def _limit(self, memory: int, pids: int, cpus: float) -> None:
        quota = max(int(cpus * _PERIOD_US), 1000)
        if self.layout.version == 2:
            (d,) = self.dirs
            _write(d / "memory.max", memory)
            _write(d / "memory.swap.max", 0, optional=True)
            _write(d / "pids.max", pids)
            (d / "cpu.max").write_text(f"{quota} {_PERIOD_US}")
            return
        mem, pid, cpu = self.dirs
        _write(mem / "memory.limit_in_bytes", memory)
        _write(mem / "memory.memsw.limit_in_bytes", memory, optional=True)  # no swap past it
        _write(pid / "pids.max", pids)
        _write(cpu / "cpu.cfs_period_us", _PERIOD_US)
        _write(cpu / "cpu.cfs_quota_us", quota)

    def procs_files(self) -> list[str]:
        """The cgroup.procs files a process writes its pid to, to join."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return found

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer has ended in it so far."""
        source = "memory.events" if self.layout.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (self.dirs[0] / source).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def peak_memory(self) -> int | None:
        source = "memory.peak" if self.layout.version == 2 else "memory.max_usage_in_bytes"
        with contextlib.suppress(OSError, ValueError):
            return int((self.dirs[0] / source).read_text())
        return None

    def kill(self, wait: float = 5.0) -> bool:
        """SIGKILL every process in it until none is left (or ``wait`` passes); True if empty."""
        end = time.monotonic() + wait
        kill_file = self.dirs[0] / "cgroup.kill"
        while True:
            left = self.pids()
            if not left:
                return True
            if self.layout.version == 2 and kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > end:
                return False
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left and delete it (idempotent)."""
        if any(d.exists() for d in self.dirs):
            self.kill()
        for d in self.dirs:
            for _ in range(200):  # a killed task leaves its cgroup a moment after it dies
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def existing() -> list[str]:
    """Names of the bwrap cgroups on this host (for gc)."""
    try:
        found = layout()
    except EngineUnavailable:
        return []
    names: set[str] = set()
    for base in found.bases:
        with contextlib.suppress(OSError):
            names.update(p.name for p in base.iterdir() if p.name.startswith(PREFIX))
    return sorted(names)


def _write(path: Path, value: int, optional: bool = False) -> None:
    try:
        path.write_text(str(value))
    except FileNotFoundError:
        if not optional:
            raise EngineUnavailable(f"{path} is missing: this kernel lacks that limit") from None
    except OSError as exc:
        if not optional:
            raise EngineUnavailable(f"cannot set {path}: {exc.strerror}") from None
