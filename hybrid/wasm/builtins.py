"""The built-in check modules shipped in ``hybrid/wasm/modules`` (built by wasm_modules/build.py).

Each is compiled once per machine (the disk cache) and loaded once per process: the hot path of a
check is a dict lookup, not a read and hash of the module file.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import wasmtime

from hybrid.errors import EngineUnavailable, InvalidInput
from hybrid.wasm.runtime import load_module

MODULES_DIR = Path(__file__).resolve().parent / "modules"
NAMES = ("csv", "json", "grep", "redact", "scope")

_loaded: dict[str, wasmtime.Module] = {}
_lock = threading.Lock()


def module_path(name: str) -> Path:
    """Where the shipped module ``name`` lives."""
    if name not in NAMES:
        raise InvalidInput(f"no built-in check {name!r} (the checks are {', '.join(NAMES)})")
    return MODULES_DIR / f"{name}.wasm"


def module(name: str) -> wasmtime.Module:
    """The compiled built-in module ``name`` (compiled or deserialized on first use only)."""
    cached = _loaded.get(name)
    if cached is not None:
        return cached
    path = module_path(name)
    with _lock:
        cached = _loaded.get(name)
        if cached is None:
            if not path.is_file():
                raise EngineUnavailable(
                    f"built-in module {path.name} is missing from {MODULES_DIR}; build it with "
                    "`python wasm_modules/build.py` (needs Debian's rustc, cargo and libstd-rust-dev-wasm32)"
                )
            cached = load_module(path)
            _loaded[name] = cached
    return cached


def manifest() -> dict[str, Any]:
    """The build manifest: per module the sha256 of the .wasm and of its sources, and the toolchain."""
    path = MODULES_DIR / "manifest.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EngineUnavailable(
            f"{path} is missing; build the modules with `python wasm_modules/build.py`"
        ) from None
    return data


__all__ = ["MODULES_DIR", "NAMES", "manifest", "module", "module_path"]
