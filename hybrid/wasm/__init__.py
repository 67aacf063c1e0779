"""The embedded WebAssembly tier: wasmtime in process, fuel- and memory-capped, no daemon."""

from hybrid.wasm.runtime import load_module, run

__all__ = ["load_module", "run"]
