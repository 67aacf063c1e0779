"""The one result every tier returns, and the one rule that finishes it (``finish_result``)."""

from __future__ import annotations

from collections.abc import Sequence
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
    # Process tiers read these from the sandbox's cgroup: for one command in a long-lived
    # workstation, the growth during that command (concurrent commands share the counters).
    cpu_user_seconds: float | None = Field(None, description="CPU time in user mode, seconds.")
    cpu_system_seconds: float | None = Field(None, description="CPU time in the kernel, seconds.")
    cpu_throttled_seconds: float | None = Field(
        None, description="Time the CPU quota held the sandbox back, seconds."
    )
    oom_events: int | None = Field(
        None, description="Processes the kernel killed at the memory cap."
    )
    block_read_bytes: int | None = Field(None, description="Bytes read from block devices.")
    block_write_bytes: int | None = Field(None, description="Bytes written to block devices.")


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


_ENDED_ON_ITS_OWN = (Termination.OK, Termination.NONZERO_EXIT)


def finish_result(
    tier: str,
    termination: Termination,
    exit_code: int | None,
    *,
    stdout: bytes | bytearray | str = b"",
    stderr: bytes | bytearray | str = b"",
    stdout_truncated: bool = False,
    stderr_truncated: bool = False,
    output_bytes: int,
    wall_ms: float,
    detail: str = "",
    output_cap_closes: bool = False,
    fuel_used: int | None = None,
    peak_memory_bytes: int | None = None,
    cpu_ms: float | None = None,
    tests: Sequence[TestOutcome] = (),
    traceback: str | None = None,
) -> ExecutionResult:
    """The ExecutionResult of a finished run: every tier ends its runs through this one rule.

    The tier classifies how its run ended (``termination``, ``exit_code``, ``detail``); this
    applies what is the same everywhere:

    * Output limit: a stream cut at ``output_bytes`` (``*_truncated``) makes the run
      OUTPUT_LIMIT, "output over N bytes was cut". With ``output_cap_closes`` (the tier closes
      the guest's stream at the cap, as the wasm tiers do, so the guest sees a failed write)
      this replaces any ending, since whatever followed came from the cut; otherwise (a
      process tier drops the output past the cap and the process runs on) it replaces only an
      ending the run reached on its own (OK, NONZERO_EXIT): a timeout, an OOM kill or a dead
      sandbox says more.
    * Fuel after an interrupt: ``fuel_used == 0`` on a TIMEOUT becomes None (unknown), since
      an epoch interrupt inside pure wasm code does not write the fuel counter back.
    * Output bytes are decoded as UTF-8, undecodable bytes replaced.
    """
    if termination is Termination.TIMEOUT and fuel_used == 0:
        fuel_used = None
    cut = stdout_truncated or stderr_truncated
    if cut and (output_cap_closes or termination in _ENDED_ON_ITS_OWN):
        termination, detail = Termination.OUTPUT_LIMIT, f"output over {output_bytes} bytes was cut"
    return ExecutionResult(
        tier=tier,
        termination=termination,
        exit_code=exit_code,
        stdout=_text(stdout),
        stderr=_text(stderr),
        stdout_truncated=stdout_truncated,
        stderr_truncated=stderr_truncated,
        usage=Usage(
            wall_ms=wall_ms, fuel_used=fuel_used, peak_memory_bytes=peak_memory_bytes, cpu_ms=cpu_ms
        ),
        detail=detail,
        tests=list(tests),
        traceback=traceback,
    )


def _text(data: bytes | bytearray | str) -> str:
    return data if isinstance(data, str) else data.decode("utf-8", errors="replace")
