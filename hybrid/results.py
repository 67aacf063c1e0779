"""The one result every tier returns."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, computed_field, model_validator

from hybrid.errors import DiskLimit, ExecTimeout, ExecutionError, OutOfFuel, OutOfMemory

Millis = Annotated[float, PlainSerializer(lambda ms: round(ms, 2), when_used="json")]
"""Milliseconds: full precision in process, rounded to 0.01 ms in JSON (more is noise)."""


class Termination(StrEnum):
    """Why a run ended."""

    OK = "ok"
    NONZERO_EXIT = "nonzero_exit"
    TIMEOUT = "timeout"
    OUT_OF_FUEL = "out_of_fuel"
    OUT_OF_MEMORY = "out_of_memory"
    TRAP = "trap"
    OUTPUT_LIMIT = "output_limit"
    DISK_LIMIT = "disk_limit"
    DENIED = "denied"
    ERROR = "error"


class Usage(BaseModel):
    """Resources a run consumed, where the tier can measure them."""

    wall_ms: Millis = Field(description="Wall-clock time of the run itself, in milliseconds.")
    fuel_used: int | None = Field(None, description="WebAssembly fuel consumed (wasm tier only).")
    peak_memory_bytes: int | None = Field(None, description="Peak memory, where known.")
    cpu_ms: Millis | None = Field(None, description="CPU time, where known.")


class TestOutcome(BaseModel):
    """One test's result, for runs that execute tests."""

    __test__ = False  # not a pytest class

    name: str = Field(description="Test function name, or the assert line it came from.")
    passed: bool
    message: str = Field(
        "", description="Failure message (exception type and text), empty on success."
    )


class ExecutionResult(BaseModel):
    """What a run did: how it ended, bounded output, usage and the tier that ran it."""

    model_config = ConfigDict(extra="forbid")

    tier: str = Field(description="The tier that ran it: wasm, python-wasm, docker, gvisor, ...")
    termination: Termination
    exit_code: int | None = Field(
        description="Process exit status; None when the run was killed or trapped."
    )
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    usage: Usage
    detail: str = Field("", description="One line on why the run ended, when it did not end ok.")
    tests: list[TestOutcome] = Field(
        default_factory=list, description="Per-test outcomes, when tests ran."
    )
    traceback: str | None = Field(
        None, description="Bounded traceback of an uncaught error, when there was one."
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        """True when the run finished normally with exit status 0 and every test passed."""
        return self.termination is Termination.OK and all(t.passed for t in self.tests)

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        # A dumped result carries ``ok``, which is computed, not given: loading it back works.
        if isinstance(data, dict) and "ok" in data:
            data = {k: v for k, v in data.items() if k != "ok"}
        return data

    def raise_for_termination(self) -> ExecutionResult:
        """Raise the matching ExecutionError unless the run ended ok; return self otherwise."""
        if self.termination is Termination.OK:
            return self
        message = f"{self.tier} run ended with {self.termination.value}"
        if self.detail:
            message += f": {self.detail}"
        error = {
            Termination.TIMEOUT: ExecTimeout,
            Termination.OUT_OF_FUEL: OutOfFuel,
            Termination.OUT_OF_MEMORY: OutOfMemory,
            Termination.DISK_LIMIT: DiskLimit,
        }.get(self.termination, ExecutionError)
        raise error(message, result=self)
