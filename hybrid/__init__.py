"""hybrid: real-file context, tiered sandboxes and a generate-execute-debug loop for coding agents."""

from hybrid.errors import (
    ContextError,
    EngineUnavailable,
    ExecTimeout,
    ExecutionError,
    HybridError,
    InvalidDiff,
    InvalidInput,
    InvalidPattern,
    ModuleError,
    OutOfFuel,
    OutOfMemory,
    PolicyError,
    PolicyViolation,
    WorkstationError,
    WorkstationNotFound,
)
from hybrid.policy import Budget, Environment, Mount, NetworkPolicy, SandboxSpec, admit, enforce
from hybrid.results import ExecutionResult, Termination, TestOutcome, Usage

# Heavier parts load on first use, so `import hybrid` (and a CLI command that needs none of them)
# does not pay for wasmtime, tree-sitter or the Docker SDK.
_LAZY = {
    "check_csv": "hybrid.checks",
    "check_json": "hybrid.checks",
    "grep": "hybrid.checks",
    "redact": "hybrid.checks",
    "scope": "hybrid.checks",
    "CheckReport": "hybrid.checks",
    "CsvReport": "hybrid.checks",
    "JsonReport": "hybrid.checks",
    "GrepReport": "hybrid.checks",
    "RedactReport": "hybrid.checks",
    "ScopeReport": "hybrid.checks",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hybrid' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Budget",
    "CheckReport",
    "ContextError",
    "CsvReport",
    "EngineUnavailable",
    "Environment",
    "ExecTimeout",
    "ExecutionError",
    "ExecutionResult",
    "GrepReport",
    "HybridError",
    "InvalidDiff",
    "InvalidInput",
    "InvalidPattern",
    "JsonReport",
    "ModuleError",
    "Mount",
    "NetworkPolicy",
    "OutOfFuel",
    "OutOfMemory",
    "PolicyError",
    "PolicyViolation",
    "RedactReport",
    "SandboxSpec",
    "ScopeReport",
    "Termination",
    "TestOutcome",
    "Usage",
    "WorkstationError",
    "WorkstationNotFound",
    "admit",
    "check_csv",
    "check_json",
    "enforce",
    "grep",
    "redact",
    "scope",
]
