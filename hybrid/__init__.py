"""hybrid: real-file context, tiered sandboxes and a generate-execute-debug loop for coding agents."""

from hybrid.errors import (
    ContextError,
    DiskLimit,
    EngineUnavailable,
    ExecTimeout,
    ExecutionError,
    HybridError,
    InvalidDeclaration,
    InvalidDiff,
    InvalidInput,
    InvalidPattern,
    ModelError,
    ModelExhausted,
    ModelTimeout,
    ModuleError,
    OutOfFuel,
    OutOfMemory,
    PolicyError,
    PolicyViolation,
    WorkstationError,
    WorkstationNotFound,
)

# typing costs the console client (hybrid/server/client.py) ~3 ms to import.
_TYPE_CHECKING = False
if _TYPE_CHECKING:
    from hybrid.checks import (
        CheckReport,
        CsvReport,
        GrepReport,
        JsonReport,
        RedactReport,
        ScopeReport,
        check_csv,
        check_json,
        grep,
        redact,
        scope,
    )
    from hybrid.context import (
        ContextPack,
        EvalReport,
        PackItem,
        RepoMap,
        context_pack,
        evaluate,
        repo_map,
        skeleton,
    )
    from hybrid.policy import (
        Budget,
        Environment,
        Mount,
        NetworkPolicy,
        SandboxSpec,
        Service,
        admit,
        enforce,
    )
    from hybrid.results import ExecutionResult, Termination, TestOutcome, Usage
    from hybrid.router import Job, Route, route, run
    from hybrid.wasm.python import PythonPool, available_modules, run_python
    from hybrid.workstation import GcReport, SnapshotInfo, Workstation, WorkstationInfo

# Everything but the errors loads on first use: `import hybrid.cli` stays cheap, and a command
# pays only for what it touches (pydantic, wasmtime, tree-sitter, the Docker SDK).
_LAZY = {
    **dict.fromkeys(
        [
            "Budget",
            "Environment",
            "Mount",
            "NetworkPolicy",
            "SandboxSpec",
            "Service",
            "admit",
            "enforce",
        ],
        "hybrid.policy",
    ),
    **dict.fromkeys(["ExecutionResult", "Termination", "TestOutcome", "Usage"], "hybrid.results"),
    **dict.fromkeys(["Job", "Route", "route", "run"], "hybrid.router"),
    **dict.fromkeys(
        [
            "repo_map",
            "RepoMap",
            "context_pack",
            "ContextPack",
            "PackItem",
            "skeleton",
            "evaluate",
            "EvalReport",
        ],
        "hybrid.context",
    ),
    **dict.fromkeys(["run_python", "available_modules", "PythonPool"], "hybrid.wasm.python"),
    **dict.fromkeys(
        ["Workstation", "WorkstationInfo", "SnapshotInfo", "GcReport"], "hybrid.workstation"
    ),
    **dict.fromkeys(
        [
            "check_csv",
            "check_json",
            "grep",
            "redact",
            "scope",
            "CheckReport",
            "CsvReport",
            "JsonReport",
            "GrepReport",
            "RedactReport",
            "ScopeReport",
        ],
        "hybrid.checks",
    ),
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
    "ContextPack",
    "CsvReport",
    "DiskLimit",
    "EngineUnavailable",
    "Environment",
    "EvalReport",
    "ExecTimeout",
    "ExecutionError",
    "ExecutionResult",
    "GcReport",
    "GrepReport",
    "HybridError",
    "InvalidDeclaration",
    "InvalidDiff",
    "InvalidInput",
    "InvalidPattern",
    "Job",
    "JsonReport",
    "ModelError",
    "ModelExhausted",
    "ModelTimeout",
    "ModuleError",
    "Mount",
    "NetworkPolicy",
    "OutOfFuel",
    "OutOfMemory",
    "PackItem",
    "PolicyError",
    "PolicyViolation",
    "PythonPool",
    "RedactReport",
    "RepoMap",
    "Route",
    "SandboxSpec",
    "ScopeReport",
    "Service",
    "SnapshotInfo",
    "Termination",
    "TestOutcome",
    "Usage",
    "Workstation",
    "WorkstationError",
    "WorkstationInfo",
    "WorkstationNotFound",
    "admit",
    "available_modules",
    "check_csv",
    "check_json",
    "context_pack",
    "enforce",
    "evaluate",
    "grep",
    "redact",
    "repo_map",
    "route",
    "run",
    "run_python",
    "scope",
    "skeleton",
]
