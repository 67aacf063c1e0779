"""A warm pool of one-shot sandboxes per (tier, image, spec), kept by the resident server.

Creating a hardened container (volume, sized disk, container, start) costs most of a
one-shot run; running a command in a started one costs one exec. So the server creates a few
ahead of time for each key that jobs have asked for, hands each to exactly one job, and has
it destroyed after that job (the reset boundary: no sandbox ever serves a second job, so
nothing one job leaves is seen by the next). A key nobody asked for within ``idle_seconds``
goes cold: its sandboxes are destroyed and not replaced.

Every pooled sandbox is an ordinary one-shot workstation made by ``backend().create`` with the
job's own spec, so it is as hardened as one made for the job, carries the server's owner label
(``hybrid ws gc`` and the reaper remove it once the server is gone) and its PID 1 ends it
after its lifetime even if nobody does. Each also comes with a slot (slot.py): an exec already
started in it, waiting for the job's command, which the daemon hands to the job's worker with
the reply (the connection's descriptor), so the command does not wait for ``runc exec``.

The server's workers call ``acquire`` (tiers/container.py does, for any container tier); the
daemon's ``SandboxPool`` answers over the worker's control line. Outside a server ``acquire``
returns None and the tier creates its sandbox itself.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybrid.policy import SandboxSpec
    from hybrid.server.worker import Control
    from hybrid.workstation.docker import DockerWorkstation
    from hybrid.workstation.docker.slot import Slot

log = logging.getLogger(__name__)

DEFAULT_SIZE = 1
"""Ready sandboxes kept per key that jobs use."""

DEFAULT_IDLE = 300.0
"""Seconds a key (and a ready sandbox) may wait unused before it is dropped."""

_control: Control | None = None


def connect(control: Control) -> None:
    """Make ``acquire`` ask the daemon behind ``control`` (done once by each server worker)."""
    global _control
    _control = control


def key_of(tier: str, image: str | None, spec: SandboxSpec) -> dict[str, Any]:
    """What a pooled sandbox must match: the tier, the image and the whole spec."""
    return {"tier": tier, "image": image, "spec": spec.model_dump(mode="json")}


@contextlib.contextmanager
def sandbox(tier: str, image: str | None, spec: SandboxSpec) -> Iterator[DockerWorkstation | None]:
    """A pooled sandbox for one job (or None: the caller makes its own), released after it."""
    if _control is None:
        yield None
        return
    reply = _control.ask(op="acquire", key=key_of(tier, image, spec), timeout=10)
    if not reply or not reply.get("id"):
        yield None
        return
    from hybrid.workstation import backend
    from hybrid.workstation.docker import DockerWorkstation
    from hybrid.workstation.docker.engine import client, translate

    with translate("open a pooled sandbox"):
        # The daemon's record of the container as made: no engine call on the job's path.
        container = client().containers.prepare_model(reply["attrs"])
        ws = DockerWorkstation(container, backend())
    if reply.get("slot") and reply.get("fd") is not None:
        from hybrid.workstation.docker.slot import Slot

        ws.take_slot(Slot(str(reply["slot"]), socket.socket(fileno=int(reply["fd"]))))
    try:
        yield ws
    finally:
        ws.drop_slot()
        # The daemon destroys it off the job's path; it is never handed out again.
        _control.tell(op="release", id=ws.id)


@dataclass
class _Ready:
    id: str
    attrs: dict[str, Any]  # the engine's inspect of the started container
    slot: Slot | None = None  # an exec already waiting for the job's command (slot.py)
    made: float = field(default_factory=time.monotonic)


@dataclass
class _Key:
    key: dict[str, Any]
    wanted: float = field(default_factory=time.monotonic)
    ready: list[_Ready] = field(default_factory=list)
    making: int = 0


class SandboxPool:
    """The daemon's side: ready sandboxes per key, refilled and retired on a background thread."""

    def __init__(self, size: int = DEFAULT_SIZE, idle_seconds: float = DEFAULT_IDLE) -> None:
        self.size = size
        self.idle_seconds = idle_seconds
        self._keys: dict[str, _Key] = {}
        self._doomed: list[str] = []
        self._destroying = 0
        self._lock = threading.Condition()
        self._closed = False
        self.hits = 0
        self.slotted = 0  # hits whose sandbox had a slot waiting (slot.py)
        self.misses = 0
        self._thread = threading.Thread(target=self._loop, name="hybrid-pool", daemon=True)
        self._thread.start()

    def want(self, key: dict[str, Any]) -> None:
        """Keep sandboxes ready for ``key`` (as if a job had just asked for one)."""
        self._entry(key)

    def acquire(self, key: dict[str, Any]) -> _Ready | None:
        """A ready sandbox for ``key`` (removed from the pool), or None; refills either way."""
        entry = self._entry(key)
        with self._lock:
            now = time.monotonic()
            while entry.ready:
                got = entry.ready.pop(0)
                if now - got.made < self.idle_seconds:
                    self.hits += 1
                    self.slotted += got.slot is not None
                    self._lock.notify_all()
                    return got
                self._doom(got)
            self.misses += 1
            self._lock.notify_all()
        return None

    def release(self, sandbox_id: str) -> None:
        """A used sandbox: destroy it in the background."""
        with self._lock:
            self._doomed.append(sandbox_id)
            self._lock.notify_all()

    def ready_ids(self) -> list[str]:
        with self._lock:
            return [r.id for e in self._keys.values() for r in e.ready]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "size": self.size,
                "idle_seconds": self.idle_seconds,
                "hits": self.hits,
                "slotted": self.slotted,
                "misses": self.misses,
                "destroying": len(self._doomed) + self._destroying,
                "keys": [
                    {
                        "tier": e.key["tier"],
                        "image": e.key["image"],
                        "ready": len(e.ready),
                        "making": e.making,
                    }
                    for e in self._keys.values()
                ],
            }

    def close(self) -> None:
        """Destroy every ready sandbox and wait for the background thread (idempotent)."""
        with self._lock:
            self._closed = True
            for entry in self._keys.values():
                for ready in entry.ready:
                    self._doom(ready)
                entry.ready.clear()
            self._lock.notify_all()
        self._thread.join(120)
        self._destroy_doomed()

    def _entry(self, key: dict[str, Any]) -> _Key:
        import json

        name = json.dumps(key, sort_keys=True)
        with self._lock:
            entry = self._keys.get(name)
            if entry is None:
                entry = self._keys[name] = _Key(key)
            entry.wanted = time.monotonic()
            self._lock.notify_all()
            return entry

    def _loop(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                self._retire()
                todo = None if self._doomed else self._next_to_make()
                if todo is None and not self._doomed:
                    self._lock.wait(1.0)
                    continue
                if todo is not None:
                    todo.making += 1
            if todo is None:
                self._destroy_doomed()
                continue
            made = self._make(todo.key)
            with self._lock:
                todo.making -= 1
                if made is not None:
                    if self._closed:
                        self._doom(made)
                    else:
                        todo.ready.append(made)

    def _doom(self, ready: _Ready) -> None:
        """Have ``ready`` destroyed (its slot's shell ends at once: nothing will come)."""
        if ready.slot is not None:
            ready.slot.close()
        self._doomed.append(ready.id)

    def _retire(self) -> None:
        now = time.monotonic()
        for name, entry in list(self._keys.items()):
            for ready in [r for r in entry.ready if now - r.made >= self.idle_seconds]:
                entry.ready.remove(ready)
                self._doom(ready)
            if now - entry.wanted >= self.idle_seconds and not entry.ready and not entry.making:
                del self._keys[name]

    def _next_to_make(self) -> _Key | None:
        now = time.monotonic()
        for entry in self._keys.values():
            cold = now - entry.wanted >= self.idle_seconds
            if not cold and len(entry.ready) + entry.making < self.size:
                return entry
        return None

    def _make(self, key: dict[str, Any]) -> _Ready | None:
        from hybrid.policy import SandboxSpec
        from hybrid.tiers.container import ONE_SHOT_SETUP_SECONDS
        from hybrid.workstation import backend

        spec = SandboxSpec.model_validate(key["spec"])
        wall = spec.budget.wall_seconds
        # Idle in the pool, then a job's setup (a repository copy included) and its budget.
        lifetime = self.idle_seconds + ONE_SHOT_SETUP_SECONDS + max(60.0, wall) + wall
        try:
            ws = backend().create(spec, image=key["image"], lifetime=lifetime)
        except Exception as exc:  # the engine is down or the key is unusable: jobs create their own
            log.warning("pool: cannot make a %s sandbox: %s", key["tier"], exc)
            time.sleep(5)
            return None
        return _Ready(ws.id, ws.attrs(), _open_slot(ws))

    def _destroy_doomed(self) -> None:
        with self._lock:
            doomed, self._doomed = self._doomed, []
            self._destroying += len(doomed)
        if not doomed:
            return
        from hybrid.workstation import backend
        from hybrid.workstation.docker.engine import client

        made = backend()
        for sandbox_id in doomed:
            with contextlib.suppress(Exception):
                labels = client().api.inspect_container(sandbox_id)["Config"]["Labels"] or {}
                made.remove_container(sandbox_id, labels.get("hybrid.volume"))
            with self._lock:
                self._destroying -= 1


def _open_slot(ws: DockerWorkstation) -> Slot | None:
    """An exec waiting in ``ws`` for the job's command (None if it cannot be started: the job
    then makes an ordinary exec)."""
    try:
        return ws.open_slot()
    except Exception as exc:
        log.warning("pool: no slot in %s: %s", ws.name, exc)
        return None
