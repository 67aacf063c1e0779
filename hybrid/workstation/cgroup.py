"""Resource counters of one cgroup (v1 or v2), read around a command for its ``Usage``.

A container's cgroup is found from its init process (``/proc/PID/cgroup``), so any layout works:
cgroupfs (``/docker/<id>``), systemd (``docker-<id>.scope``), runsc's sandbox cgroup under
gVisor. Counters are cumulative, so a command's share is the difference of two samples; the
memory peak is reset before the command where the kernel allows it (v1: write 0 to
``memory.max_usage_in_bytes``; v2: ``memory.peak`` is reset per open file). Every read is
best effort: a counter the host does not expose stays None, never a guess.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

_MOUNTINFO = Path("/proc/self/mountinfo")
_V1_NEEDED = ("cpuacct", "memory")


class Sample(NamedTuple):
    """Cumulative counters at one moment (None: not exposed here)."""

    user_ns: int | None
    system_ns: int | None
    throttled_ns: int | None
    read_bytes: int | None
    write_bytes: int | None
    oom_kills: int | None
    peak_bytes: int | None


class Delta(NamedTuple):
    """What happened between two samples; the Usage fields of one command."""

    cpu_user_seconds: float | None
    cpu_system_seconds: float | None
    cpu_throttled_seconds: float | None
    block_read_bytes: int | None
    block_write_bytes: int | None
    oom_events: int | None
    peak_memory_bytes: int | None


def _mounts() -> dict[str, Path]:
    """Controller name -> v1 mount point; "" -> the cgroup2 mount point."""
    found: dict[str, Path] = {}
    try:
        lines = _MOUNTINFO.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            found.setdefault("", point)
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                found.setdefault(option, point)
    return found


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text.split()[0]) if text else None
    except (ValueError, IndexError):
        return None


def _keyed(path: Path) -> dict[str, int]:
    """``key value`` lines (cpu.stat, memory.events, memory.oom_control)."""
    out: dict[str, int] = {}
    for line in (_read(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


@dataclass
class Cgroup:
    """One group's directories: per controller under v1, one directory under v2."""

    v1: dict[str, Path]
    v2: Path | None = None
    _peak_fd: int | None = None

    @classmethod
    def of_pid(cls, pid: int, naming: str | None = None) -> Cgroup | None:
        """The cgroup process ``pid`` is in (a container's init: the container's), or None;
        also None when ``naming`` is given and the cgroup's path does not contain it."""
        text = _read(Path(f"/proc/{pid}/cgroup"))
        if not text or pid <= 0 or (naming is not None and naming not in text):
            return None
        mounts = _mounts()
        v1: dict[str, Path] = {}
        v2: Path | None = None
        for line in text.splitlines():
            hierarchy, _, rest = line.partition(":")
            controllers, _, relative = rest.partition(":")
            if hierarchy == "0" and not controllers:
                if "" in mounts:
                    v2 = mounts[""] / relative.lstrip("/")
                continue
            for name in controllers.split(","):
                if name in mounts:
                    v1[name] = mounts[name] / relative.lstrip("/")
        if all(name in v1 and v1[name].is_dir() for name in _V1_NEEDED):
            return cls(v1)
        # A hybrid host's cgroup2 often holds no controllers: only use it when it has them.
        if v2 is not None and (v2 / "cpu.stat").exists() and (v2 / "memory.current").exists():
            return cls({}, v2)
        return None

    def reset_peak(self) -> None:
        """Start the memory peak afresh (best effort: without the right, it is the group's lifetime peak)."""
        if self.v2 is not None:
            self.close()
            with contextlib.suppress(OSError):
                fd = os.open(self.v2 / "memory.peak", os.O_RDWR)
                self._peak_fd = fd
                os.write(fd, b"reset\n")  # resets what this descriptor reads (Linux 6.12+)
            return
        with contextlib.suppress(OSError, KeyError):
            (self.v1["memory"] / "memory.max_usage_in_bytes").write_text("0")

    def sample(self) -> Sample | None:
        """The counters now; None once the group is gone (its container stopped)."""
        return self._sample_v2() if self.v2 is not None else self._sample_v1()

    def _sample_v1(self) -> Sample | None:
        acct, memory = self.v1["cpuacct"], self.v1["memory"]
        user, system = _int(acct / "cpuacct.usage_user"), _int(acct / "cpuacct.usage_sys")
        if not acct.is_dir():
            return None  # the container stopped: its group went with it
        cpu = self.v1.get("cpu")
        throttled = _keyed(cpu / "cpu.stat").get("throttled_time") if cpu else None
        read = write = None
        blkio = self.v1.get("blkio")
        if blkio is not None:
            text = _read(blkio / "blkio.throttle.io_service_bytes")
            if text is not None:
                read = write = 0
                for line in text.splitlines():
                    parts = line.split()
                    if len(parts) == 3 and parts[1] in ("Read", "Write"):
                        if parts[1] == "Read":
                            read += int(parts[2])
                        else:
                            write += int(parts[2])
        return Sample(
            user_ns=user,
            system_ns=system,
            throttled_ns=throttled,
            read_bytes=read,
            write_bytes=write,
            oom_kills=_keyed(memory / "memory.oom_control").get("oom_kill"),
            peak_bytes=_int(memory / "memory.max_usage_in_bytes"),
        )

    def _sample_v2(self) -> Sample | None:
        assert self.v2 is not None
        cpu = _keyed(self.v2 / "cpu.stat")
        if not cpu:
            return None
        read = write = None
        text = _read(self.v2 / "io.stat")
        if text is not None:
            read = write = 0
            for line in text.splitlines():
                for field in line.split()[1:]:
                    key, _, value = field.partition("=")
                    if key == "rbytes":
                        read += int(value)
                    elif key == "wbytes":
                        write += int(value)
        peak = None
        if self._peak_fd is not None:
            with contextlib.suppress(OSError, ValueError):
                peak = int(os.pread(self._peak_fd, 64, 0).split()[0])
        if peak is None:
            peak = _int(self.v2 / "memory.peak")

        def micro(key: str) -> int | None:
            return cpu[key] * 1000 if key in cpu else None

        return Sample(
            user_ns=micro("user_usec"),
            system_ns=micro("system_usec"),
            throttled_ns=micro("throttled_usec"),
            read_bytes=read,
            write_bytes=write,
            oom_kills=_keyed(self.v2 / "memory.events").get("oom_kill"),
            peak_bytes=peak,
        )

    def close(self) -> None:
        """Release the v2 peak descriptor (idempotent)."""
        if self._peak_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._peak_fd)
            self._peak_fd = None


def delta(before: Sample | None, after: Sample | None) -> Delta:
    """The counters' growth from ``before`` to ``after``; a field either lacks stays None."""
    if before is None or after is None:
        return Delta(None, None, None, None, None, None, None)

    def grew(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else max(b - a, 0)

    def seconds(a: int | None, b: int | None) -> float | None:
        ns = grew(a, b)
        return None if ns is None else ns / 1e9

    return Delta(
        cpu_user_seconds=seconds(before.user_ns, after.user_ns),
        cpu_system_seconds=seconds(before.system_ns, after.system_ns),
        cpu_throttled_seconds=seconds(before.throttled_ns, after.throttled_ns),
        block_read_bytes=grew(before.read_bytes, after.read_bytes),
        block_write_bytes=grew(before.write_bytes, after.write_bytes),
        oom_events=grew(before.oom_kills, after.oom_kills),
        peak_memory_bytes=after.peak_bytes,
    )
