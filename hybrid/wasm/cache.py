"""Compiled-module cache: memory first, then disk, keyed by content hash, wasmtime version and engine config.

Compiling a module costs 50 ms to seconds; deserializing a cached one costs well under a millisecond.
Entries are written atomically (temp file + rename), so concurrent processes never read half a file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import wasmtime

from hybrid.errors import ModuleError
from hybrid.paths import cache_dir
from hybrid.wasm import engine as _engine

if TYPE_CHECKING:
    from wasmtime.component import Component

log = logging.getLogger(__name__)
Kind = Literal["module", "component"]
T = TypeVar("T", bound=Any)


class CompiledCache:
    """Thread-safe cache of compiled modules and components for the shared Engine."""

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = directory
        self._memory: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @property
    def directory(self) -> Path:
        if self._directory is None:
            self._directory = cache_dir("wasm", _engine.fingerprint())
        return self._directory

    def key(self, data: bytes) -> str:
        """Cache key: content hash plus the engine fingerprint."""
        digest = hashlib.sha256(data)
        digest.update(_engine.fingerprint().encode())
        return digest.hexdigest()

    def module(self, data: bytes, name: str = "module") -> wasmtime.Module:
        """A compiled core module for ``data`` (binary or WAT text)."""
        return self._get(data, name, "module", wasmtime.Module)

    def component(self, data: bytes, name: str = "component") -> Component:
        """A compiled component for ``data`` (a component binary)."""
        from wasmtime.component import Component  # ~6 ms of import that core-module runs skip

        return self._get(data, name, "component", Component)

    def _get(self, data: bytes, name: str, kind: Kind, cls: type[T]) -> T:
        key = self.key(data)
        cached = self._memory.get(key)
        if cached is not None:
            return cached
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            cached = self._memory.get(key)
            if cached is None:
                cached = self._load_or_compile(key, data, name, kind, cls)
                self._memory[key] = cached
        return cached

    def _load_or_compile(self, key: str, data: bytes, name: str, kind: Kind, cls: type[T]) -> T:
        eng = _engine.engine()
        path = self.directory / f"{key}.{kind}"
        if path.exists():
            try:
                loaded = cls.deserialize_file(eng, str(path))
                log.debug("%s %s: compiled copy loaded from %s", kind, name, path)
                return loaded
            except wasmtime.WasmtimeError:
                path.unlink(missing_ok=True)  # stale or corrupt: recompile below
        log.info(
            "%s %s: compiling (%d bytes; cached afterwards in %s)", kind, name, len(data), path
        )
        compiled = _compile(eng, data, name, kind, cls)
        _write_atomic(path, bytes(compiled.serialize()))
        return compiled


def _compile(
    eng: wasmtime.Engine,
    data: bytes,
    name: str,
    kind: Kind,
    cls: Callable[[wasmtime.Engine, bytes], T],
) -> T:
    if kind == "module" and not data.startswith(b"\0asm"):
        try:
            data = bytes(wasmtime.wat2wasm(data.decode("utf-8")))
        except (UnicodeDecodeError, wasmtime.WasmtimeError) as exc:
            raise ModuleError(
                f"{name}: not a WebAssembly module (neither binary nor valid WAT): {_first_line(exc)}"
            ) from None
    try:
        return cls(eng, data)
    except wasmtime.WasmtimeError as exc:
        raise ModuleError(f"{name}: not a valid WebAssembly {kind}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


CACHE = CompiledCache()
"""The process-wide cache."""
