"""One error family for the whole toolkit.

Every error a user can act on is a ``HybridError`` and carries the CLI exit code it maps to::

    HybridError (1)
    ├── InvalidInput (2)               bad input from the user: fix the input and retry
    │   ├── PolicyError                a policy file that does not parse or validate
    │   ├── ModuleError                a file that is not a WebAssembly module
    │   ├── InvalidPattern             a regular expression that does not compile
    │   └── InvalidDiff                a unified diff that does not parse
    ├── PolicyViolation (3)            admit() refused a spec; .violations lists every reason
    ├── ExecutionError (4)             a run ended abnormally (raised by ExecutionResult.raise_for_termination)
    │   ├── ExecTimeout                also a TimeoutError
    │   ├── OutOfFuel
    │   ├── OutOfMemory                also a MemoryError
    │   └── DiskLimit                  the writable area hit its disk cap
    ├── EngineUnavailable (5)          a tier's engine (Docker, gVisor, a toolchain) is missing here
    ├── WorkstationError (6)           a workstation operation failed
    │   ├── WorkstationNotFound        also a LookupError
    │   └── DependencyError            a project's dependencies could not be resolved or installed
    ├── ContextError (7)               repo map / context pack could not be built
    └── ModelError (8)                 a model endpoint failed (after its retries)
        ├── ModelTimeout               also a TimeoutError
        └── ModelExhausted             a replayed or scripted model has no answer left

Foreign errors (wasmtime traps, docker.errors.*) are translated at the tier boundary,
never in callers.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections.abc costs the console client (server/client.py) ~3 ms
    from collections.abc import Sequence


class HybridError(Exception):
    """Root of every error this toolkit raises on purpose."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(HybridError):
    """The input (a file, an option, a request) is malformed; the message says what to fix."""

    exit_code = 2


class PolicyError(InvalidInput):
    """A sandbox policy file is malformed or has invalid values."""


class ModuleError(InvalidInput):
    """A file is not a WebAssembly module (binary or text) that this runtime can load."""


class InvalidPattern(InvalidInput):
    """A regular expression does not compile."""


class InvalidDiff(InvalidInput):
    """A unified diff does not parse."""


class InvalidDeclaration(InvalidInput):
    """A project's own dependency declaration (a lockfile, a requirement) cannot be read."""


class PolicyViolation(HybridError):
    """A spec asks for something the policy does not allow; ``violations`` lists every reason."""

    exit_code = 3

    def __init__(self, violations: Sequence[str]) -> None:
        self.violations = list(violations)
        super().__init__("policy refused: " + "; ".join(self.violations))

    def __reduce__(self) -> tuple[type[PolicyViolation], tuple[list[str]]]:
        # Sent to another process (a pool worker, a Ray node) it comes back whole.
        return type(self), (self.violations,)


class ExecutionError(HybridError):
    """A run ended abnormally; ``result`` is the full ExecutionResult when there is one."""

    exit_code = 4

    def __init__(self, message: str, result: object | None = None) -> None:
        super().__init__(message)
        self.result = result

    def __reduce__(self) -> tuple[type[ExecutionError], tuple[str, object | None]]:
        return type(self), (self.message, self.result)


class ExecTimeout(ExecutionError, TimeoutError):
    """The run hit its wall-clock deadline."""


class OutOfFuel(ExecutionError):
    """The run used up its fuel (instruction) budget."""


class OutOfMemory(ExecutionError, MemoryError):
    """The run hit its memory cap."""


class DiskLimit(ExecutionError):
    """The run filled its workspace or scratch directory up to the disk cap (``budget.disk``)."""


class EngineUnavailable(HybridError):
    """A tier's engine is not usable on this host; the message says how to enable it."""

    exit_code = 5


class WorkstationError(HybridError):
    """A workstation operation failed."""

    exit_code = 6


class WorkstationNotFound(WorkstationError, LookupError):
    """No workstation, snapshot or file by that name."""


class DependencyError(WorkstationError):
    """A project's dependencies could not be resolved, downloaded or installed; the message says which."""


class ContextError(HybridError):
    """A repo map, skeleton or context pack could not be built."""

    exit_code = 7


class ModelError(HybridError):
    """A model endpoint failed after its retries; the message never carries the API key."""

    exit_code = 8


class ModelTimeout(ModelError, TimeoutError):
    """A model call took longer than its timeout (after its retries)."""


class ModelExhausted(ModelError):
    """A replayed or scripted model has no recorded answer left."""


__all__ = [
    "ContextError",
    "DependencyError",
    "DiskLimit",
    "EngineUnavailable",
    "ExecTimeout",
    "ExecutionError",
    "HybridError",
    "InvalidDiff",
    "InvalidInput",
    "InvalidPattern",
    "ModelError",
    "ModelExhausted",
    "ModelTimeout",
    "ModuleError",
    "OutOfFuel",
    "OutOfMemory",
    "PolicyError",
    "PolicyViolation",
    "WorkstationError",
    "WorkstationNotFound",
]
