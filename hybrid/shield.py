"""Engine work that an interrupt does not cut in half.

An interrupt (Ctrl-C, SIGTERM, the CLI's closed-reader signal) lands in the main thread as an
exception at any bytecode. Inside a request to the Docker engine it closes the client's end of
the request while the engine goes on: the container is created after the cleanup that tried to
remove it got a 404, or started after its removal. So work that makes or removes engine objects
runs in a thread of its own: the caller waits, and an interrupt meanwhile lets the work end (long
waits inside it stop early at ``raise_if_cancelled``), undoes what it made, then propagates.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

_local = threading.local()


class Cancelled(BaseException):
    """Raised inside shielded work whose caller was interrupted (at ``raise_if_cancelled``)."""


def raise_if_cancelled() -> None:
    """In shielded work: stop here (raise Cancelled) once the caller was interrupted."""
    cancelled: threading.Event | None = getattr(_local, "cancelled", None)
    if cancelled is not None and cancelled.is_set():
        raise Cancelled


def shielded(work: Callable[[], T], undo: Callable[[T], object] | None = None) -> T:
    """``work()``, run to its end even if an interrupt lands meanwhile; the interrupt then
    propagates after ``undo(result)`` (itself shielded) removed what the work made."""
    result: list[T] = []
    failure: list[BaseException] = []
    cancelled = threading.Event()
    done = threading.Event()

    def run() -> None:
        _local.cancelled = cancelled
        try:
            result.append(work())
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="hybrid-shielded", daemon=True).start()
    interrupt: BaseException | None = None
    # Not Thread.join: interrupted, it can mark a thread that still runs as stopped (3.11).
    while not done.is_set():
        try:
            done.wait()
        except BaseException as exc:  # an interrupt: the work ends first, a second one too
            interrupt = interrupt or exc
            cancelled.set()
    if interrupt is not None:
        if result and undo is not None:
            made = result[0]
            try:
                shielded(lambda: undo(made))
            except Exception as exc:  # the interrupt is what the caller must see
                log.warning("could not undo interrupted work: %s", exc)
        raise interrupt
    if failure:
        raise failure[0]
    return result[0]
