"""The host-side backstop of exec deadlines: one helper process per client process.

The watchdog inside an exec runs as the sandbox's user, so code of that user can stop it. The
backstop runs on the host, in a session of its own (a killed client does not take it along),
where nothing inside can signal it: past an exec's deadline and a grace it asks the engine
whether the exec still runs and, if so, kills the container, as the supervisor would have.

One helper serves every exec of a process. The client arms and disarms deadlines with lines on
the helper's stdin; when the client goes (the pipe closes, a kill included) the helper keeps the
deadlines still armed and exits after the last. A helper per exec cost a Python start (~20 ms
of CPU on these hosts) on every exec's path. This file runs as that helper too (``python -P
backstop.py``), so it imports only the standard library at the top and the Docker SDK only when
a deadline fires.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import subprocess
import sys
import threading
import time

GRACE = 3.0
"""Seconds past an exec's deadline before the backstop acts (the supervisor and the watchdog
inside go first)."""


class Backstop:
    """The client's end: ``arm`` a deadline for an exec, ``disarm`` it when the exec ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._inherited: subprocess.Popen[bytes] | None = None
        self._tokens = itertools.count()

    def arm(self, exec_id: str, container: str, deadline: float) -> str | None:
        """Hold ``deadline`` (epoch seconds) for the exec; a token for ``disarm``, or None if no
        helper could be started (the supervisor and the watchdog still hold it)."""
        token = str(next(self._tokens))
        due = deadline + GRACE
        return token if self._send(f"arm {token} {exec_id} {container} {due:.3f}\n") else None

    def disarm(self, token: str | None) -> None:
        """The exec ended: forget its deadline."""
        if token is not None:
            self._send(f"disarm {token}\n")

    def helper(self) -> tuple[int, int] | None:
        """The running helper's pid and the descriptor of its pipe held here (None: none)."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.poll() is not None:
            return None
        return proc.pid, proc.stdin.fileno()

    def _send(self, line: str) -> bool:
        with self._lock:
            for _ in range(2):  # a helper that died is replaced once
                proc = self._helper()
                if proc is None or proc.stdin is None:
                    return False
                try:
                    proc.stdin.write(line.encode())
                    proc.stdin.flush()
                    return True
                except OSError:
                    self._forget()
            return False

    def _helper(self) -> subprocess.Popen[bytes] | None:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._forget()
        with contextlib.suppress(OSError):
            self._proc = subprocess.Popen(
                # -P: the helper's own directory (this package) must not shadow what it imports.
                [sys.executable, "-P", __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                start_new_session=True,
                close_fds=True,
            )
        return self._proc

    def _forget(self) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        self._proc = None

    def _after_fork(self) -> None:
        # A forked child (a server worker) must not write into its parent's helper, nor keep
        # that helper alive by holding its pipe open: it starts its own when it needs one.
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                os.close(self._proc.stdin.fileno())
        # Kept, not collected: a collected Popen of a running process warns and would be waited
        # for, and it is the parent's child, not this one's.
        self._inherited = self._proc
        self._proc = None
        self._lock = threading.Lock()


_BACKSTOP = Backstop()
os.register_at_fork(after_in_child=_BACKSTOP._after_fork)


def arm(exec_id: str, container: str, deadline: float) -> str | None:
    """Arm the process's backstop for one exec (see ``Backstop.arm``)."""
    return _BACKSTOP.arm(exec_id, container, deadline)


def disarm(token: str | None) -> None:
    """Disarm one exec's deadline (see ``Backstop.disarm``)."""
    _BACKSTOP.disarm(token)


def helper() -> tuple[int, int] | None:
    """This process's helper: its pid and the pipe descriptor held for it, or None.

    It is kept on purpose for the life of the process (an exec costs one line to it), so a
    leftover check that looks at child processes and descriptors must leave exactly these out."""
    return _BACKSTOP.helper()


# -- the helper ------------------------------------------------------------------------------


def _fire(exec_id: str, container: str) -> None:
    import docker

    api = docker.from_env(timeout=30).api
    try:
        running = api.exec_inspect(exec_id).get("Running")
    except docker.errors.NotFound:
        running = False  # the engine drops exec records when the container stops
    if running:
        api.kill(container)


def _fire_quietly(exec_id: str, container: str) -> None:
    with contextlib.suppress(Exception):
        _fire(exec_id, container)


def _serve() -> None:
    armed: dict[str, tuple[str, str, float]] = {}
    client_open = True
    pending = b""
    while client_open or armed:
        now = time.time()
        for token, (exec_id, container, due) in list(armed.items()):
            if due <= now:
                del armed[token]
                # Its own thread, so a slow engine does not hold up the lines that follow.
                threading.Thread(target=_fire_quietly, args=(exec_id, container)).start()
        soonest = min((due for _, _, due in armed.values()), default=None)
        wait = None if soonest is None else max(soonest - time.time(), 0.0)
        if not client_open:
            time.sleep(wait or 0.0)
            continue
        if not select.select([0], [], [], wait)[0]:
            continue
        data = os.read(0, 65536)
        if not data:
            client_open = False
            continue
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            match line.decode(errors="replace").split():
                case ["arm", token, exec_id, container, at]:
                    with contextlib.suppress(ValueError):
                        armed[token] = (exec_id, container, float(at))
                case ["disarm", token]:
                    armed.pop(token, None)


if __name__ == "__main__":
    _serve()
