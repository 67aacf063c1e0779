"""Python snippets in WebAssembly: CPython 3.14 (componentize-py) in a fresh wasmtime instance per run."""

from hybrid.wasm.python.guest import build, component, is_ready
from hybrid.wasm.python.pool import PythonPool
from hybrid.wasm.python.runner import DEFAULT_SPEC, available_modules, run_python
from hybrid.wasm.python.staging import InputFiles

__all__ = [
    "DEFAULT_SPEC",
    "InputFiles",
    "PythonPool",
    "available_modules",
    "build",
    "component",
    "is_ready",
    "run_python",
]
