"""The process-wide wasmtime Engine and the epoch ticker that enforces wall-clock deadlines."""

from __future__ import annotations

import atexit
import functools
import math
import threading
import time
from importlib.metadata import version

import wasmtime

TICK_SECONDS = 0.005
"""Epoch period: a deadline is enforced to within about one tick."""

_lock = threading.Lock()
_engine: wasmtime.Engine | None = None
_stop = threading.Event()


def engine() -> wasmtime.Engine:
    """The shared Engine (fuel and epoch interruption on); starts the ticker on first use."""
    global _engine
    if _engine is None:
        with _lock:
            if _engine is None:
                config = wasmtime.Config()
                config.consume_fuel = True
                config.epoch_interruption = True
                eng = wasmtime.Engine(config)
                threading.Thread(
                    target=_tick, args=(eng,), name="hybrid-wasm-epoch", daemon=True
                ).start()
                _engine = eng
    return _engine


def _tick(eng: wasmtime.Engine) -> None:
    # Catch up on ticks a late wake-up missed (a loaded host or a busy GIL), so epochs track
    # wall-clock time and a deadline does not stretch with the load.
    next_at = time.monotonic() + TICK_SECONDS
    while not _stop.wait(max(0.0, next_at - time.monotonic())):
        now = time.monotonic()
        while next_at <= now:
            eng.increment_epoch()
            next_at += TICK_SECONDS


@atexit.register
def _shutdown() -> None:
    _stop.set()


def deadline_ticks(seconds: float) -> int:
    """Epoch ticks for a wall-clock budget (at least one full tick, rounded up)."""
    return max(1, math.ceil(seconds / TICK_SECONDS)) + 1


@functools.cache
def fingerprint() -> str:
    """What a compiled artefact depends on besides its bytes: wasmtime version and engine config."""
    return f"wasmtime-{version('wasmtime')}-fuel-epoch"
