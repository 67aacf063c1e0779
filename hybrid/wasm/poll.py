"""A deadline-aware ``poll_oneoff`` for WASI preview 1 guests.

Epoch interruption only stops code running inside WebAssembly: a guest blocked in a host call
(``sleep()`` is ``poll_oneoff`` on a clock) would outlive its wall-clock budget. This host function
shadows wasmtime's: it sleeps at most until the run's deadline and then traps, so the run ends as
a timeout on time. File-descriptor subscriptions report ready at once (the tier's stdin is a file
and its outputs are drained continuously), so nothing here can block past the deadline.
"""

from __future__ import annotations

import struct
import threading
import time

import wasmtime

_SUBSCRIPTION = 48
_EVENT = 32
_CLOCK, _FD_READ, _FD_WRITE = 0, 1, 2
_ABSTIME = 1
_EINVAL = 28
_ENOTSUP = 58

_current = threading.local()


class DeadlineReached(Exception):
    """Raised inside the host call when the sleep would pass the run's deadline."""


def set_deadline(deadline: float | None) -> None:
    """Start a run on this thread with a deadline (a ``time.monotonic()`` value), or end it (None)."""
    _current.deadline = deadline
    if deadline is not None:
        _current.hit = False
        # wasmtime's guest monotonic clock counts from the WASI context's creation, just before this.
        _current.origin = time.monotonic_ns()


def deadline_hit() -> bool:
    """Whether the last run on this thread was stopped inside poll_oneoff."""
    return bool(getattr(_current, "hit", False))


def _poll_oneoff(
    caller: wasmtime.Caller, in_ptr: int, out_ptr: int, nsubs: int, nevents_ptr: int
) -> int:
    memory = caller.get("memory")
    if not isinstance(memory, wasmtime.Memory) or nsubs == 0:
        return _EINVAL
    raw = memory.read(caller, in_ptr, in_ptr + nsubs * _SUBSCRIPTION)
    ready: list[tuple[int, int]] = []  # (userdata, type) of fd subscriptions
    clocks: list[tuple[int, float]] = []  # (userdata, seconds from now)
    for i in range(nsubs):
        sub = raw[i * _SUBSCRIPTION : (i + 1) * _SUBSCRIPTION]
        userdata, tag = struct.unpack_from("<QB", sub, 0)
        if tag == _CLOCK:
            clock_id, timeout, _precision, flags = struct.unpack_from("<I4xQQH", sub, 16)
            if flags & _ABSTIME:
                now = time.time_ns() if clock_id == 0 else time.monotonic_ns() - _current.origin
                timeout = max(0, timeout - now)
            clocks.append((userdata, timeout / 1e9))
        elif tag in (_FD_READ, _FD_WRITE):
            ready.append((userdata, tag))
        else:
            return _EINVAL
    events = bytearray()
    if ready:
        for userdata, tag in ready:
            events += struct.pack("<QHBxxxxxQH6x", userdata, 0, tag, 0, 0)
    else:
        wait = min(seconds for _, seconds in clocks)
        deadline = getattr(_current, "deadline", None)
        if deadline is not None and time.monotonic() + wait > deadline:
            time.sleep(max(0.0, deadline - time.monotonic()))
            _current.hit = True
            raise DeadlineReached("wall-clock deadline reached during sleep")
        time.sleep(wait)
        for userdata, seconds in clocks:
            if seconds <= wait:
                events += struct.pack("<QHBxxxxxQH6x", userdata, 0, _CLOCK, 0, 0)
    memory.write(caller, bytes(events), out_ptr)
    memory.write(caller, struct.pack("<I", len(events) // _EVENT), nevents_ptr)
    return 0


POLL_TYPE = wasmtime.FuncType([wasmtime.ValType.i32()] * 4, [wasmtime.ValType.i32()])


def install(linker: wasmtime.Linker) -> None:
    """Shadow the WASI preview 1 poll_oneoff in ``linker`` with the deadline-aware one."""
    linker.allow_shadowing = True
    linker.define_func(
        "wasi_snapshot_preview1", "poll_oneoff", POLL_TYPE, _poll_oneoff, access_caller=True
    )
    linker.allow_shadowing = False
