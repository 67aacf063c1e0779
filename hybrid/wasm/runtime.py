"""Run a WASI command module under a SandboxSpec: fuel, memory cap, epoch deadline, bounded output.

Each run gets a fresh Store (no state survives between runs), a private I/O directory for its
stdin file and output pipes (in /dev/shm when there is one: creating and removing it there costs
a tenth of what it does on disk), a writable scratch directory preopened at the spec's workspace,
and explicit preopens for the spec's mounts. The I/O directory is deleted on every path.
The scratch directory is empty at the start of every run: whatever a guest wrote is deleted with
its directory when the run ends; an untouched one is reused by the thread's next run, because
making one costs as much as a small run itself. Scratch directories are removed at interpreter exit.

The scratch is capped at ``budget.disk`` (default 64 MiB) by the kernel: where this process may
mount (root), it is a private tmpfs of exactly that size (and an inode count to match), mounted,
opened and detached at once, so it has no path, appears in no mount table and vanishes with the
last descriptor, even if the process is killed. A write past the cap fails with ENOSPC inside the
guest, so not one byte more is stored. Without mount rights the scratch is a plain directory whose
size is only measured after the run (the wall clock bounds the writes): see ``scratch_capped``.

Scratch directories and I/O directories are named for the process that made them
(hybrid/owner.py), so the first run of a later process reaps what a killed one left.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import wasmtime

from hybrid import owner
from hybrid.errors import InvalidInput, ModuleError, PolicyViolation
from hybrid.paths import display, read_input
from hybrid.policy import Mount, SandboxSpec, admit, check_input_path, check_text, human_size
from hybrid.results import ExecutionResult, Termination, finish_result
from hybrid.wasm import engine as _engine
from hybrid.wasm import poll
from hybrid.wasm.cache import CACHE
from hybrid.wasm.pipes import OutputPipe

_DEFAULT_SPEC = SandboxSpec(tier="wasm")
_IO_ROOT = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
_PAGE = 65536
# Messages a guest prints when its allocator is refused more memory by the store limit.
_OOM_MARKERS = ("memory allocation of", "MemoryError", "out of memory", "Cannot allocate memory")


_local = threading.local()
_scratch_dirs: set[Path] = set()
_scratch_fds: set[int] = set()
_MNT_DETACH = 2
_FAILED = (Termination.NONZERO_EXIT, Termination.TRAP, Termination.ERROR)
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_can_mount: bool | None = None


class _Scratch:
    """One scratch directory: a detached tmpfs held by ``fd`` (capped) or a plain directory."""

    def __init__(self, path: str, size: int, fd: int | None) -> None:
        self.path = path  # what the guest's workspace preopen opens
        self.size = size
        self.fd = fd

    def entries(self) -> int | str:
        return self.fd if self.fd is not None else self.path

    def remove(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the last reference: the kernel frees the tmpfs and its pages
            _scratch_fds.discard(self.fd)
        else:
            shutil.rmtree(self.path, ignore_errors=True)
            _scratch_dirs.discard(Path(self.path))


def scratch_capped() -> bool:
    """Whether this process gives each run a size-capped scratch (it may mount a tmpfs)."""
    global _can_mount
    if _can_mount is None:
        probe = _tmpfs(_PAGE * 16)
        # The guest's preopen reaches the detached tmpfs through /proc/self/fd.
        _can_mount = probe is not None and os.path.isdir(f"/proc/self/fd/{probe}")
        if probe is not None:
            os.close(probe)
    return _can_mount


def _tmpfs(size: int) -> int | None:
    """A descriptor on a new tmpfs of ``size`` bytes that no path reaches, or None if mounting
    is not allowed here."""
    point = tempfile.mkdtemp(prefix="hybrid-scratch-", dir=_IO_ROOT)
    try:
        options = f"size={size},nr_inodes={max(1024, size // 4096)},mode=0700".encode()
        flags = 0x2 | 0x4 | 0x8  # MS_NOSUID | MS_NODEV | MS_NOEXEC
        if _libc.mount(b"tmpfs", point.encode(), b"tmpfs", flags, options) != 0:
            return None
        try:
            return os.open(point, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        finally:
            _libc.umount2(point.encode(), _MNT_DETACH)
    finally:
        os.rmdir(point)


def _acquire_scratch(size: int) -> _Scratch:
    scratch: _Scratch | None = getattr(_local, "scratch", None)
    _local.scratch = None  # owned by this run until released
    if scratch is not None and scratch.size != size:
        scratch.remove()  # a tmpfs is sized when mounted; a clean one costs little to remake
        scratch = None
    if scratch is None:
        owner.reap_once()  # a thread's first run: off every later run's path
        fd = _tmpfs(size) if _can_mount is not False and scratch_capped() else None
        if fd is not None:
            _scratch_fds.add(fd)
            scratch = _Scratch(f"/proc/self/fd/{fd}", size, fd)
        else:
            path = owner.make_dir("hybrid-run-")
            _scratch_dirs.add(path)
            scratch = _Scratch(str(path), size, None)
    return scratch


def _release_scratch(scratch: _Scratch) -> None:
    with os.scandir(scratch.entries()) as entries:
        dirty = next(entries, None) is not None
    if dirty:
        scratch.remove()
    else:
        _local.scratch = scratch


def _scratch_full(scratch: _Scratch) -> bool:
    """Whether a run filled its scratch to the cap (measured after it ended)."""
    if scratch.fd is not None:
        stat = os.fstatvfs(scratch.fd)
        return stat.f_bavail * stat.f_frsize < _PAGE or stat.f_favail == 0
    used = 0
    for root, dirs, files in os.walk(scratch.path):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                used += os.lstat(os.path.join(root, name)).st_blocks * 512
    return used >= scratch.size


@atexit.register
def remove_scratch_dirs() -> None:
    """Remove every idle scratch directory (runs still in flight keep theirs)."""
    for scratch in list(_scratch_dirs):
        shutil.rmtree(scratch, ignore_errors=True)
        _scratch_dirs.discard(scratch)
    for fd in list(_scratch_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
        _scratch_fds.discard(fd)
    _local.scratch = None


def _linker() -> wasmtime.Linker:
    # One Linker per thread: cheap to keep, and never shared across concurrent instantiations.
    linker = getattr(_local, "linker", None)
    if linker is None:
        linker = wasmtime.Linker(_engine.engine())
        linker.define_wasi()
        poll.install(linker)
        _local.linker = linker
    return linker


def load_module(module: str | Path | bytes | wasmtime.Module) -> wasmtime.Module:
    """Compile (or fetch from the cache) a module given as a path, bytes or a Module."""
    if isinstance(module, wasmtime.Module):
        return module
    if isinstance(module, bytes):
        return CACHE.module(module)
    path = Path(module)
    return CACHE.module(read_input(path, error=ModuleError), name=str(path))


def run(
    module: str | Path | bytes | wasmtime.Module,
    args: Sequence[str] = (),
    *,
    stdin: bytes | str | Path | None = None,
    spec: SandboxSpec | None = None,
    program: str = "module",
) -> ExecutionResult:
    """Run a WASI command module's ``_start`` under ``spec`` and return how it ended.

    ``stdin`` is bytes (or text) to feed, or a Path to a host file to read from.
    Raises PolicyViolation if the spec is not admissible on the wasm tier and ModuleError
    if the module does not load; every other outcome is a typed ExecutionResult.
    """
    spec = spec or _DEFAULT_SPEC
    # WASI hands the guest NUL-terminated arguments: a NUL would split one into two.
    for i, arg in enumerate([program, *args]):
        check_text(arg, f"module argument {i}", data=True)
    if spec is not _DEFAULT_SPEC:
        violations = admit(spec, "wasm")
        if violations:
            raise PolicyViolation(violations)
    compiled = load_module(module)
    budget = spec.budget
    io_dir = owner.make_dir("hybrid-io-", _IO_ROOT)
    scratch = _acquire_scratch(budget.disk_for("wasm"))
    pipes: tuple[OutputPipe, ...] = ()
    try:
        wasi = wasmtime.WasiConfig()
        wasi.argv = [program, *args]
        wasi.env = sorted(spec.env.resolve().items())
        if stdin is not None:
            if isinstance(stdin, Path):
                if not stdin.is_file():
                    raise InvalidInput(f"{display(stdin)}: no such stdin file")
                check_input_path(stdin, "stdin file")
                try:
                    wasi.stdin_file = str(stdin)
                except UnicodeEncodeError:  # WASI takes UTF-8 paths: hand over the bytes
                    stdin = read_input(stdin, "stdin file")
                except wasmtime.WasmtimeError:  # it could not open the file: say why
                    stdin = read_input(stdin, "stdin file")
            if not isinstance(stdin, Path):
                stdin_path = io_dir / "stdin"
                stdin_path.write_bytes(stdin.encode() if isinstance(stdin, str) else stdin)
                wasi.stdin_file = str(stdin_path)
        out = OutputPipe(io_dir / "stdout", budget.output_bytes)
        err = OutputPipe(io_dir / "stderr", budget.output_bytes)
        wasi.stdout_file = str(out.path)
        wasi.stderr_file = str(err.path)
        pipes = (out, err)
        wasi.preopen_dir(scratch.path, spec.workspace, True)
        preopen_mounts(wasi, spec.mounts)

        for pipe in pipes:
            pipe.start()
        store = wasmtime.Store(_engine.engine())
        store.set_fuel(budget.fuel)
        store.set_limits(memory_size=budget.memory)
        store.set_epoch_deadline(_engine.deadline_ticks(budget.wall_seconds))
        store.set_wasi(wasi)

        exit_code: int | None = None
        termination = Termination.OK
        detail = ""
        memory_bytes: int | None = None
        start = time.perf_counter()
        poll.set_deadline(time.monotonic() + budget.wall_seconds)
        try:
            instance = _linker().instantiate(store, compiled)
            exports = instance.exports(store)
            entry = exports.get("_start")
            if not isinstance(entry, wasmtime.Func):
                raise ModuleError(f"{program}: not a WASI command module (no _start export)")
            try:
                entry(store)
                exit_code = 0
            finally:
                memory = exports.get("memory")
                if isinstance(memory, wasmtime.Memory):
                    memory_bytes = memory.size(store) * _PAGE
        except wasmtime.ExitTrap as exc:
            exit_code = exc.code
            if exit_code != 0:
                termination, detail = Termination.NONZERO_EXIT, f"exit status {exit_code}"
        except wasmtime.Trap as exc:
            termination, detail = classify_trap(exc)
        except wasmtime.WasmtimeError as exc:
            termination, detail = classify_error(exc)
        except poll.DeadlineReached:
            pass  # classified just below
        finally:
            poll.set_deadline(None)
        if poll.deadline_hit():
            termination, detail, exit_code = (
                Termination.TIMEOUT,
                "wall-clock deadline reached",
                None,
            )
        wall_ms = (time.perf_counter() - start) * 1000
        fuel_used = budget.fuel - store.get_fuel()
        store.close()  # closes the guest's ends of the pipes, so draining sees EOF
        stdout, stdout_cut = out.finish()
        stderr_bytes, stderr_cut = err.finish()
        stderr = stderr_bytes.decode("utf-8", errors="replace")
        if termination in (Termination.NONZERO_EXIT, Termination.TRAP, Termination.ERROR) and (
            any(marker in stderr for marker in _OOM_MARKERS)
            or (memory_bytes is not None and memory_bytes + 16 * _PAGE >= budget.memory)
        ):
            termination, detail = (
                Termination.OUT_OF_MEMORY,
                f"memory cap of {budget.memory} bytes reached",
            )
        if termination in _FAILED and _scratch_full(scratch):
            termination, detail = (
                Termination.DISK_LIMIT,
                f"the scratch directory {spec.workspace} is full (cap {human_size(scratch.size)}); "
                "raise it with budget.disk (--disk); the output so far is kept",
            )
        return finish_result(
            "wasm",
            termination,
            exit_code,
            stdout=stdout,
            stderr=stderr,
            stdout_truncated=stdout_cut,
            stderr_truncated=stderr_cut,
            output_bytes=budget.output_bytes,
            output_cap_closes=True,
            wall_ms=wall_ms,
            detail=detail,
            fuel_used=fuel_used,
            peak_memory_bytes=memory_bytes,
        )
    finally:
        for pipe in pipes:
            pipe.finish()
        shutil.rmtree(io_dir, ignore_errors=True)
        _release_scratch(scratch)


def preopen_mounts(wasi: wasmtime.WasiConfig, mounts: Sequence[Mount]) -> None:
    """Grant each mount's host directory at its target (read-only unless mode is rw)."""
    for mount in mounts:
        source = mount.source.expanduser()
        if not source.is_dir():
            raise InvalidInput(f"{source}: not a directory (the wasm tiers grant directories only)")
        wasi.preopen_dir(str(source), mount.target, mount.mode == "rw")


def classify_trap(exc: wasmtime.Trap) -> tuple[Termination, str]:
    """Map a wasmtime Trap to a termination and one line of detail (shared by the wasm tiers)."""
    code = exc.trap_code
    if code == wasmtime.TrapCode.OUT_OF_FUEL:
        return Termination.OUT_OF_FUEL, "fuel budget used up"
    if code == wasmtime.TrapCode.INTERRUPT:
        return Termination.TIMEOUT, "wall-clock deadline reached"
    return Termination.TRAP, trap_summary(exc.message)


def classify_error(exc: wasmtime.WasmtimeError) -> tuple[Termination, str]:
    """Map a WasmtimeError (components report traps as these, without a trap code) likewise."""
    text = str(exc)
    if "all fuel consumed" in text:
        return Termination.OUT_OF_FUEL, "fuel budget used up"
    if "interrupt" in text:
        return Termination.TIMEOUT, "wall-clock deadline reached"
    if "memory" in text and ("minimum" in text or "limit" in text):
        return Termination.OUT_OF_MEMORY, trap_summary(text)
    if "wasm trap" in text or "wasm backtrace" in text:
        return Termination.TRAP, trap_summary(text)
    return Termination.ERROR, trap_summary(text)


_FRAME = re.compile(r"^\s*\d+:\s+0x[0-9a-f]+ - (?:.*!)?(.+?)\s*$")
_FRAMES_SHOWN = 3


def trap_summary(text: str) -> str:
    """One line from wasmtime's multi-line report: the cause, then the innermost frames.

    wasmtime writes ``error while executing at wasm backtrace:``, the frames, then ``Caused by:``
    and the cause; the first line alone says nothing.
    """
    lines = [line.strip() for line in text.strip().splitlines()]
    frames = [m.group(1) for line in text.splitlines() if (m := _FRAME.match(line))]
    causes: list[str] = []
    if "Caused by:" in lines:
        after = lines[lines.index("Caused by:") + 1 :]
        causes = [re.sub(r"^\d+:\s*", "", line) for line in after if line]
    head = next((line for line in lines if line), "unknown error")
    if causes:
        head = ": ".join(c.removeprefix("wasm trap: ") for c in causes)
    elif frames and head.endswith("wasm backtrace:"):
        head = "trap"
    if frames:
        shown = " <- ".join(frames[:_FRAMES_SHOWN])
        more = (
            f" <- ... ({len(frames) - _FRAMES_SHOWN} more)" if len(frames) > _FRAMES_SHOWN else ""
        )
        head += f" (in {shown}{more})"
    return head
