"""Progress of long work on stderr: a live bar or spinner on a terminal, plain lines otherwise.

A person at a terminal sees a transient bar; a log, a CI job or an agent reading a pipe sees a
few ``hybrid: ...`` lines. Short work shows nothing either way: the first plain line comes only
after ``DELAY`` seconds, so a quick or refused command keeps its one-line stderr.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

_FORCES = ("FORCE_COLOR", "TTY_COMPATIBLE")  # what rich reads besides isatty()
DELAY = 1.0
"""Seconds of work before the first plain line."""
EVERY = 10.0
"""Seconds between plain lines when the work reports no new tenth."""


def _terminal() -> bool:
    # rich's test honours FORCE_COLOR and kin, but importing rich costs a command ~20 ms: a
    # plain pipe (how agents call) with none of them set is answered without it.
    if not sys.stderr.isatty() and not any(map(os.environ.get, _FORCES)):
        return False
    from rich.console import Console

    return Console(stderr=True).is_terminal


@contextmanager
def progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """A ``progress(done, total)`` callback for ``label`` (e.g. "parsing files")."""
    if _terminal():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        ) as bar:
            task_id = bar.add_task(label, total=None)
            yield lambda done, total: bar.update(task_id, completed=done, total=total)
        return
    start = time.monotonic()
    shown = {"tenth": -1, "at": 0.0}

    def update(done: int, total: int) -> None:
        now = time.monotonic()
        if now - start < DELAY:
            return
        tenth = done * 10 // total if total else 0
        if tenth > shown["tenth"] or now - shown["at"] >= EVERY:
            shown.update(tenth=tenth, at=now)
            percent = f" ({done * 100 // total}%)" if total else ""
            click.echo(f"hybrid: {label} {done}/{total}{percent}", err=True)

    yield update
    if shown["tenth"] >= 0:
        click.echo(f"hybrid: {label}: done in {time.monotonic() - start:.1f} s", err=True)


@contextmanager
def status(text: str, live: bool = True) -> Iterator[None]:
    """``text`` while the block runs: a spinner on a terminal (when ``live``), else a plain line
    once the work has taken ``DELAY`` seconds, and one more when it ends."""
    if _terminal():
        if not live:
            yield
            return
        from rich.console import Console

        with Console(stderr=True).status(text, spinner="dots"):
            yield
        return
    start = time.monotonic()
    lock = threading.Lock()
    said = threading.Event()

    def say() -> None:
        with lock:
            if not finished:
                click.echo(f"hybrid: {text} ...", err=True)
                said.set()

    finished = False
    timer = threading.Timer(DELAY, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            finished = True
        timer.cancel()
    if said.is_set():
        click.echo(f"hybrid: {text}: done in {time.monotonic() - start:.1f} s", err=True)
