"""The python-wasm guest: built from the project's own sources with componentize-py, cached compiled.

The component (CPython 3.14 + the bundled standard library + ``wasm_modules/python/app.py``,
~27 MB) is not committed. The first use builds it into the cache directory, keyed by a hash of
the guest sources and the componentize-py version (~10-20 s), and the shared compiled cache
then compiles it once for this wasmtime (~10 s). Later processes load it in milliseconds.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from wasmtime import WasmtimeError
from wasmtime.component import Component

from hybrid.errors import EngineUnavailable
from hybrid.paths import cache_dir
from hybrid.wasm import engine as _engine
from hybrid.wasm.cache import CACHE

WORLD = "snippet"
APP = "app"
BUILD_TIMEOUT = 900.0

Progress = Callable[[str], None]

_lock = threading.Lock()
_component: Component | None = None


def source_dir() -> Path:
    """Where the guest sources live: ``$HYBRID_PY_GUEST_DIR`` if set, else the package's
    ``guest_src`` (a symlink to ``wasm_modules/python`` in the checkout, a copy in a wheel)."""
    override = os.environ.get("HYBRID_PY_GUEST_DIR")
    if override:
        return Path(override)
    packaged = Path(__file__).resolve().parent / "guest_src"
    if (packaged / f"{APP}.py").is_file():
        return packaged
    return Path(__file__).resolve().parents[3] / "wasm_modules" / "python"


def _sources(root: Path) -> list[Path]:
    files = [root / f"{APP}.py", *sorted((root / "wit").glob("*.wit"))]
    missing = [str(f) for f in files if not f.is_file()]
    if missing or len(files) < 2:
        raise EngineUnavailable(
            f"python-wasm guest sources not found under {root} (missing: {', '.join(missing) or 'wit/*.wit'}); "
            "install hybrid from its source checkout or set HYBRID_PY_GUEST_DIR"
        )
    return files


def _componentize_version() -> str:
    try:
        return version("componentize-py")
    except PackageNotFoundError:
        raise EngineUnavailable(
            "componentize-py is not installed: pip install componentize-py==0.25.1 "
            "(it builds the python-wasm guest)"
        ) from None


def fingerprint() -> str:
    """Hash of the guest sources and the componentize-py version: the built component's identity."""
    root = source_dir()
    digest = hashlib.sha256(f"componentize-py {_componentize_version()}\n".encode())
    for path in _sources(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def component_path() -> Path:
    """Where the built component for the current sources lives (it may not exist yet)."""
    return cache_dir("python-wasm") / f"guest-{fingerprint()}.wasm"


def build(*, force: bool = False, progress: Progress | None = None) -> Path:
    """Build the guest component if it is missing (or ``force``); return its path.

    Safe across threads and processes: one builder holds a lock file, the rest wait for it.
    Raises EngineUnavailable when componentize-py is missing or the build fails.
    """
    target = component_path()
    if target.is_file() and not force:
        return target
    lock_path = target.with_suffix(".lock")
    with _lock, open(lock_path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if target.is_file() and not force:
            return target  # another process built it while we waited
        if progress:
            progress("building the python-wasm guest with componentize-py (one time, ~20 s)")
        _sweep(target.parent)
        _componentize(source_dir(), target)
        _prune(target)
    return target


KEEP_BUILDS = 3
"""Builds kept per cache (several checkouts or branches may share one cache directory)."""


def _prune(keep: Path) -> None:
    """Remove all but the newest builds (~40 MB each, ~60 MB compiled)."""

    def built_at(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0  # removed meanwhile by another process

    builds = sorted(keep.parent.glob("guest-*.wasm"), key=built_at, reverse=True)
    stale = {p.stem for p in builds[KEEP_BUILDS:]} - {keep.stem}
    for old in keep.parent.glob("guest-*"):
        if old.stem not in stale:
            continue
        if old.suffix == ".key":
            compiled = _compiled_path(old.read_text().strip())
            if compiled is not None:
                compiled.unlink(missing_ok=True)
        old.unlink(missing_ok=True)


def _compiled_path(key: str) -> Path | None:
    if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
        return None
    return CACHE.directory / f"{key}.component"


def _componentize(root: Path, target: Path) -> None:
    """Build the component into ``target``, which appears whole or not at all.

    componentize-py writes into a file with no name yet (O_TMPFILE in the cache directory,
    reached through /proc/self/fd): if the build fails or its process is killed (a server stopped
    while its workers warm up), the kernel frees the file and nothing is left in the cache. Only a
    finished build gets a name, and then the target's. Where the filesystem has no O_TMPFILE, a
    named ``.build-<pid>-*`` file is used and removed on failure; one whose builder died is swept
    by the next build."""
    _componentize_version()
    try:
        fd = os.open(target.parent, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    except OSError:
        fd = -1
    if fd < 0:
        _componentize_named(root, target)
        return
    try:
        _run_componentize(root, f"/proc/self/fd/{fd}", pass_fds=(fd,))
        if not os.fstat(fd).st_size:
            raise EngineUnavailable("building the python-wasm guest failed: an empty component")
        os.fsync(fd)
        named = target.with_name(f".build-{os.getpid()}-{os.urandom(4).hex()}.wasm")
        _name(fd, named)
        os.replace(named, target)
    finally:
        os.close(fd)


def _name(fd: int, path: Path) -> None:
    """Give the unnamed file ``fd`` the name ``path`` (linkat through /proc, following the link:
    os.link without a directory descriptor calls link(2), which would link the /proc entry)."""
    fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(str(fd), path, src_dir_fd=fds, follow_symlinks=True)
    finally:
        os.close(fds)


def _componentize_named(root: Path, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".build-{os.getpid()}-", suffix=".wasm")
    os.close(fd)
    try:
        _run_componentize(root, tmp)
        if not Path(tmp).stat().st_size:
            raise EngineUnavailable("building the python-wasm guest failed: an empty component")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _run_componentize(root: Path, output: str, pass_fds: tuple[int, ...] = ()) -> None:
    command = [
        sys.executable,
        "-c",
        "import sys; from componentize_py import script; sys.argv[0] = 'componentize-py'; sys.exit(script())",
        "-q",
        "-d",
        str(root / "wit"),
        "-w",
        WORLD,
        "componentize",
        APP,
        "-p",
        str(root),
        "-o",
        output,
    ]
    try:
        proc = subprocess.run(
            command,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            check=False,
            pass_fds=pass_fds,
            preexec_fn=_die_with_parent,  # a killed builder leaves no build running on
        )
    except subprocess.TimeoutExpired:
        raise EngineUnavailable(
            f"building the python-wasm guest took over {BUILD_TIMEOUT:.0f} s and was stopped"
        ) from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise EngineUnavailable(f"building the python-wasm guest failed (componentize-py): {tail}")


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_PR_SET_PDEATHSIG = 1


def _sweep(directory: Path) -> None:
    """Remove named build files whose builder is gone (killed before it could remove them)."""
    for left in directory.glob(".build-*.wasm"):
        pid = left.name.split("-")[1]
        if pid.isdigit():
            if _alive(int(pid)):
                continue
        else:  # an older release's name, without the builder's pid
            try:
                if time.time() - left.stat().st_mtime < BUILD_TIMEOUT:
                    continue
            except FileNotFoundError:
                continue
        left.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _known_key(path: Path) -> str | None:
    """The compiled cache's key for the component at ``path``, remembered beside it.

    Hashing the ~40 MB component on every process start costs ~70 ms; the key file makes the
    compiled form load in ~2 ms. The key includes the engine fingerprint, so a wasmtime upgrade
    simply finds no compiled file under it and compiles again.
    """
    try:
        key = path.with_suffix(".key").read_text().strip()
    except OSError:
        return None
    compiled = _compiled_path(key)
    return key if compiled is not None and compiled.is_file() else None


def is_ready() -> bool:
    """True when the component is built and compiled for this wasmtime (first use will be fast)."""
    if _component is not None:
        return True
    path = component_path()
    if not path.is_file():
        return False
    if _known_key(path) is not None:
        return True
    return (CACHE.directory / f"{CACHE.key(path.read_bytes())}.component").is_file()


def _load(path: Path, progress: Progress | None) -> Component:
    key = _known_key(path)
    if key is not None:
        compiled = _compiled_path(key)
        assert compiled is not None
        try:
            return Component.deserialize_file(_engine.engine(), str(compiled))
        except WasmtimeError:
            compiled.unlink(missing_ok=True)  # stale or corrupt: go through the cache below
    data = path.read_bytes()
    key = CACHE.key(data)
    if progress and not (CACHE.directory / f"{key}.component").is_file():
        progress("compiling the python-wasm guest for this wasmtime (one time, ~10 s)")
    loaded = CACHE.component(data, name="python-wasm guest")
    _write_key(path.with_suffix(".key"), key)
    return loaded


def _write_key(target: Path, key: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".key-")
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    os.replace(tmp, target)


def component(progress: Progress | None = None) -> Component:
    """The compiled guest component for the shared Engine: built and compiled on first use."""
    global _component
    if _component is not None:
        return _component
    with _lock:
        if _component is not None:
            return _component
    compiled = _load(build(progress=progress), progress)
    with _lock:
        _component = compiled
    return compiled


def reset() -> None:
    """Forget the in-process component (the disk caches stay); used to measure cold loads."""
    global _component
    with _lock:
        _component = None
