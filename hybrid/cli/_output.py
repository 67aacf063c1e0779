"""Shared output helpers: every command prints either JSON (``--json``) or a readable view."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from pydantic import BaseModel

from hybrid.results import ExecutionResult, Termination, Usage

_json_asked = False


def _note_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    global _json_asked
    _json_asked = _json_asked or value
    return value


# Eager, so the flag is known even when another option's value is what fails to parse.
json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    is_eager=True,
    callback=_note_json,
    help='Print machine-readable JSON (errors too: {"error": {type, message, exit_code}}).',
)


def json_asked(reset: bool = False) -> bool:
    """Whether the running command was given --json (``reset``: forget it, for a new command)."""
    global _json_asked
    asked = _json_asked
    if reset:
        _json_asked = False
    return asked


def emit_error(kind: str, message: str, exit_code: int) -> None:
    """Under --json, an error as JSON on stdout too: ``{"error": {type, message, exit_code}}``."""
    if not json_asked():
        return
    error = {"type": kind, "message": message, "exit_code": exit_code}
    try:
        json.dump({"error": error}, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # stdout gone or closed: the stderr line remains
        pass


def to_jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    return value


def emit(value: Any, as_json: bool, render: Callable[[], None]) -> None:
    """Print ``value`` as JSON, or call ``render`` for the human view."""
    if as_json:
        json.dump(to_jsonable(value), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        render()


def fail(message: str, code: int = 1) -> None:
    """Exit with ``code`` after one line on stderr (for a check that ran but failed)."""
    click.echo(message, err=True)
    raise click.exceptions.Exit(code)


def render_result(result: ExecutionResult, streamed: bool = False) -> None:
    """A run for a person: its output (unless already streamed), tests, traceback, how it ended."""
    if not streamed:
        if result.stdout:
            click.echo(result.stdout, nl=not result.stdout.endswith("\n"))
        if result.stderr:
            click.echo(result.stderr, nl=not result.stderr.endswith("\n"), err=True)
    for test in result.tests:
        mark = click.style("PASS", fg="green") if test.passed else click.style("FAIL", fg="red")
        line = f"{mark} {test.name}"
        if test.message:
            line += "\n     " + test.message.replace("\n", "\n     ")
        click.echo(line, err=True)
    if result.traceback:
        click.echo(result.traceback.rstrip("\n"), err=True)
    for cut, name in ((result.stdout_truncated, "stdout"), (result.stderr_truncated, "stderr")):
        if cut:
            click.echo(f"hybrid: {name} was cut at the output_bytes budget", err=True)
    metered = result.usage.cpu_user_seconds is not None
    if result.tests or not result.ok or metered:
        usage = result.usage
        fuel = f", fuel {usage.fuel_used:,}" if usage.fuel_used is not None else ""
        passed = sum(t.passed for t in result.tests)
        tests = f", {passed}/{len(result.tests)} tests passed" if result.tests else ""
        status = "ok" if result.ok else f"{result.termination.value}: {result.detail}"
        click.echo(
            f"hybrid: {result.tier} {status} ({usage.wall_ms:.1f} ms{fuel}{tests}"
            f"{usage_text(usage)})",
            err=True,
        )


def usage_text(usage: Usage) -> str:
    """The cgroup counters of a process-tier run, for a person (empty when there are none)."""
    from hybrid.policy import human_size

    parts = []
    if usage.cpu_user_seconds is not None and usage.cpu_system_seconds is not None:
        parts.append(f"cpu {usage.cpu_user_seconds:.2f}s user {usage.cpu_system_seconds:.2f}s sys")
    if usage.peak_memory_bytes is not None:
        parts.append(f"peak {human_size(usage.peak_memory_bytes)}")
    if usage.cpu_throttled_seconds:
        parts.append(f"throttled {usage.cpu_throttled_seconds:.2f}s")
    if usage.oom_events:
        parts.append(f"{usage.oom_events} OOM kill{'s' if usage.oom_events > 1 else ''}")
    if usage.block_read_bytes or usage.block_write_bytes:
        parts.append(
            f"io {human_size(usage.block_read_bytes or 0)} read "
            f"{human_size(usage.block_write_bytes or 0)} written"
        )
    return "".join(f", {p}" for p in parts)


def exit_code_for(result: ExecutionResult) -> int:
    """0 ok, 1 failed tests, the program's own status, 124 timed out, 125 stopped otherwise."""
    if result.termination is Termination.OK:
        return 0 if result.ok else 1
    if result.termination is Termination.NONZERO_EXIT and result.exit_code:
        return result.exit_code
    return 124 if result.termination is Termination.TIMEOUT else 125


def live_output(kind: str, chunk: bytes) -> None:
    """An ``on_output`` callback: a sandbox's output goes to our stdout or stderr as it comes."""
    stream = sys.stdout if kind == "stdout" else sys.stderr
    try:
        stream.buffer.write(chunk)
        stream.flush()
    except BrokenPipeError:
        _ReaderWatch.noticed.set()  # this error already stops the command: the watch stands down
        raise


@contextmanager
def reader_gone() -> Iterator[None]:
    """Inside: a closed stdout (``| head -1``) ends the command quietly with SIGPIPE's status 141,
    as a Unix tool would (the library stops the sandbox when its output callback raises)."""
    watch = _ReaderWatch.start()
    try:
        yield
    except (BrokenPipeError, _ReaderGone):
        # Whatever is still buffered for the closed pipe would fail again at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise click.exceptions.Exit(141) from None
    finally:
        if watch is not None:
            watch.stop()


class _ReaderGone(BaseException):
    """Raised in the main thread by ``_ReaderWatch``. Not an OSError, which the code it lands in
    may take for a closed stream of its own; a BaseException, so the library's cleanup for an
    interrupt (stop the sandbox, then re-raise) runs."""


def _reader_went_away(signum: int, frame: object) -> None:
    if not _ReaderWatch.noticed.is_set():
        _ReaderWatch.noticed.set()
        raise _ReaderGone


class _ReaderWatch:
    """Notices a closed reader without writing to it. Output over the cap is dropped rather than
    written, so a command whose output was cut never meets EPIPE: after ``| head -1`` it would
    run to its deadline. A pipe's write end polls POLLERR (a socket's POLLHUP) once the reader
    is gone; the main thread then gets ``_ReaderGone``, as a failed write gives BrokenPipeError,
    unless a failed write came first (``noticed``): a second exception would cut short the
    cleanup the first one started. SIGPIPE itself stays ignored (a write to another closed
    socket, the engine's, is no reader gone): a real-time signal no one else sends carries it."""

    noticed = threading.Event()
    GRACE = 0.2
    """Seconds a write has, once the reader is gone, to fail and stop the command the usual way."""

    def __init__(self, fd: int, signum: int) -> None:
        self._signum = signum
        self._wake_r, self._wake_w = os.pipe()
        self._main = threading.main_thread().ident or 0
        self._previous = signal.signal(signum, _reader_went_away)
        self._thread = threading.Thread(target=self._watch, args=(fd,), daemon=True)
        self._thread.start()

    @classmethod
    def start(cls) -> _ReaderWatch | None:
        """A watch of stdout when it is a pipe or a socket and this is the main thread."""
        signum = getattr(signal, "SIGRTMIN", None)
        cls.noticed.clear()
        if signum is None or threading.current_thread() is not threading.main_thread():
            return None
        try:
            fd = sys.stdout.fileno()
            mode = os.fstat(fd).st_mode
        except (OSError, ValueError, AttributeError):
            return None
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return None
        return cls(fd, signum)

    def _watch(self, fd: int) -> None:
        poller = select.poll()
        poller.register(fd, 0)  # POLLERR and POLLHUP are always reported
        poller.register(self._wake_r, select.POLLIN)
        while True:
            for ready, events in poller.poll():
                if ready == self._wake_r:
                    return
                if events & select.POLLNVAL:
                    return  # stdout was closed here: nothing left to watch
                if events & (select.POLLERR | select.POLLHUP):
                    if not self.noticed.wait(self.GRACE):
                        signal.pthread_kill(self._main, self._signum)
                    return

    def stop(self) -> None:
        """End the watch and restore the signal's disposition."""
        os.write(self._wake_w, b"x")
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)
        signal.signal(self._signum, self._previous)


class _StderrLog(logging.Handler):
    """The library's warnings (e.g. an allowed secret path) as ``hybrid: warning: ...`` lines."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"hybrid: {record.levelname.lower()}: {record.getMessage()}", err=True)


def log_to_stderr(level: int = logging.WARNING) -> None:
    """Route the ``hybrid`` loggers' records at ``level`` and above to stderr.

    The console entry point calls this with warnings; ``--verbose`` lowers the level. The
    library itself attaches no handlers: an embedding program decides where its logs go.
    """
    logger = logging.getLogger("hybrid")
    handler = next((h for h in logger.handlers if isinstance(h, _StderrLog)), None)
    if handler is None:
        handler = _StderrLog(level)
        logger.addHandler(handler)
    handler.setLevel(level)
    if logger.getEffectiveLevel() > level or logger.level > level:
        logger.setLevel(level)


def usage_error_line(exc: click.UsageError) -> str:
    """A usage error as one line: the problem and where help is, never the whole usage block."""
    message = " ".join(exc.format_message().split())
    where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return f"hybrid: error: {message}{where}"
