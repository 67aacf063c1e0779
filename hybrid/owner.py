"""Which process owns a thing on the host, so what a killed process left can be reaped.

A process is named by its pid and its start time (a recycled pid has another start time).
Host directories the wasm tiers make carry that mark in their names
(``hybrid-run-<pid>-<start>-XXXX``); containers carry it in a label (workstation/docker/labels.py).
``reap_once`` removes the directories of owners that are gone, once per process, on a
background thread, so no run pays for the scan.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import threading
from pathlib import Path

PREFIXES = ("hybrid-run-", "hybrid-io-", "hybrid-py-")
"""Directory name prefixes that carry an owner mark: wasm scratch, wasm I/O, python-wasm root."""

SHM = "/dev/shm"
_MARKED = re.compile(r"^(?:hybrid-run|hybrid-io|hybrid-py)-(\d+)-(\d+)-")

_mark: tuple[int, str] | None = None
_reaped_in: int | None = None
_lock = threading.Lock()


def start_time(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks since boot, or "?" if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def mark() -> str:
    """This process's mark, ``<pid>-<start time>`` (read once per process)."""
    global _mark
    pid = os.getpid()
    if _mark is None or _mark[0] != pid:  # a forked child is another owner
        _mark = (pid, f"{pid}-{start_time(pid)}")
    return _mark[1]


def alive(pid: int, started: str) -> bool:
    """Whether process ``pid`` that started at ``started`` still runs (a zombie does not: it
    only waits for its parent to collect its status, and will never clean up)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return len(fields) > 19 and fields[0] != "Z" and fields[19] == started


def mark_alive(mark: str) -> bool:
    """Whether the process a mark names still runs. Every form in use is read: ``<pid>-<start>``
    (``mark()``), ``<pid>:<start>`` and the engine labels' ``<host>:<pid>:<start>``, whose owner
    on another host counts as alive. Anything else names no live process."""
    parts = mark.split(":")
    if len(parts) == 1:
        parts = mark.split("-", 1)
    if len(parts) == 3:
        host, *parts = parts
        if host != socket.gethostname():
            return True
    if len(parts) != 2 or not parts[0].isdigit() or not parts[1]:
        return False
    return alive(int(parts[0]), parts[1])  # a zombie owner is gone too


def make_dir(prefix: str, root: str | None = None) -> Path:
    """A new private directory named ``<prefix><mark>-XXXX`` in ``root`` (default the temp dir)."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{mark()}-", dir=root))


def roots() -> list[str]:
    """Where marked directories are made: the temp directory and /dev/shm."""
    found = [tempfile.gettempdir()]
    if os.path.isdir(SHM) and SHM not in found:
        found.append(SHM)
    return found


def reap(where: list[str] | None = None) -> list[Path]:
    """Remove every marked directory whose owner is gone; the directories removed."""
    removed = []
    for root in where if where is not None else roots():
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            found = _MARKED.match(entry.name)
            if found is None or alive(int(found.group(1)), found.group(2)):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(Path(entry.path))
    return removed


def reap_once() -> None:
    """Start ``reap`` on a daemon thread the first time a process calls this; cheap after that."""
    global _reaped_in
    if _reaped_in == os.getpid():
        return
    with _lock:
        if _reaped_in == os.getpid():
            return
        _reaped_in = os.getpid()
    threading.Thread(target=_reap_quietly, name="hybrid-reap-dirs", daemon=True).start()


def _reap_quietly() -> None:
    with contextlib.suppress(Exception):  # best effort: the next process tries again
        reap()
