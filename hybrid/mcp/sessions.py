"""The workstations and snapshots MCP sessions made, and when they go.

A tool reaches only what its own session made (a name from another session, or one made
outside the server, is not found). Everything a session made is removed when the session ends
(its connection closes: stdio EOF, an HTTP DELETE or idle timeout), when it sits unused for
``idle_seconds``, and when the server stops. Workstations are made non-persistent, so a server
that is killed outright leaves them to the backend's reaper (their owner is gone).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field

from hybrid.errors import HybridError, WorkstationNotFound
from hybrid.workstation.base import Backend, Workstation, snapshots_of

log = logging.getLogger(__name__)

STATELESS = "stateless"
"""The session of calls that carry none (stdio, and the stateless HTTP protocol): the server's own."""


@dataclass
class _Entry:
    session: object
    workstation: Workstation
    used: float = field(default_factory=time.monotonic)


class Workstations:
    """Workstations and snapshots by name, each tied to the session that made it."""

    def __init__(self, backend: Backend, idle_seconds: float) -> None:
        self.backend = backend
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._snapshots: dict[str, object] = {}
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    @staticmethod
    def new_name(prefix: str = "mcp") -> str:
        """An unguessable name: stateless clients share one session, so names are the boundary."""
        return f"{prefix}-{secrets.token_hex(8)}"

    def add(self, session: object, workstation: Workstation) -> None:
        with self._lock:
            self._entries[workstation.name] = _Entry(session, workstation)

    def get(self, session: object, name: str) -> Workstation:
        """This session's workstation ``name``; WorkstationNotFound for any other."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or entry.session is not session:
                raise WorkstationNotFound(f"no workstation {name!r} in this session")
            entry.used = time.monotonic()
            return entry.workstation

    def names(self, session: object | None = None) -> list[str]:
        with self._lock:
            return [n for n, e in self._entries.items() if session in (None, e.session)]

    def add_snapshot(self, session: object, name: str) -> None:
        with self._lock:
            self._snapshots[name] = session

    def check_snapshot(self, session: object, name: str) -> None:
        with self._lock:
            if self._snapshots.get(name) is not session:
                raise WorkstationNotFound(f"no snapshot {name!r} in this session")

    def remove(self, session: object, name: str) -> None:
        """Remove this session's workstation ``name`` (WorkstationNotFound if it is not one)."""
        workstation = self.get(session, name)
        workstation.remove()
        with self._lock:
            self._entries.pop(name, None)

    def end_session(self, session: object) -> None:
        """Remove everything ``session`` made."""
        with self._lock:
            names = [n for n, e in self._entries.items() if e.session is session]
            snapshots = [n for n, s in self._snapshots.items() if s is session]
        self._drop(names, snapshots)

    def reap_idle(self) -> list[str]:
        """Remove the workstations unused for ``idle_seconds``; their names."""
        cutoff = time.monotonic() - self.idle_seconds
        with self._lock:
            names = [n for n, e in self._entries.items() if e.used < cutoff]
        self._drop(names, [])
        return names

    def start_reaper(self) -> None:
        """Check for idle workstations in the background until close()."""
        if self._reaper is not None:
            return
        interval = max(0.2, min(self.idle_seconds / 4, 30.0))

        def loop() -> None:
            while not self._stop.wait(interval):
                with contextlib.suppress(Exception):  # logged in _drop; try again next round
                    self.reap_idle()

        self._reaper = threading.Thread(target=loop, name="hybrid-mcp-reaper", daemon=True)
        self._reaper.start()

    def close(self) -> None:
        """Remove everything every session made (idempotent)."""
        self._stop.set()
        with self._lock:
            names = list(self._entries)
            snapshots = list(self._snapshots)
        self._drop(names, snapshots)

    def _drop(self, names: list[str], snapshots: list[str]) -> None:
        for name in names:
            with self._lock:
                entry = self._entries.pop(name, None)
            if entry is None:
                continue  # another path removed it meanwhile
            try:
                entry.workstation.remove()
            except HybridError as exc:
                log.warning("workstation %s: not removed: %s", name, exc.message)
        for snapshot in snapshots:
            with self._lock:
                self._snapshots.pop(snapshot, None)
            try:
                snapshots_of(self.backend).remove_snapshot(snapshot)
            except HybridError as exc:
                log.warning("snapshot %s: not removed: %s", snapshot, exc.message)
