from __future__ import annotations

import pytest

from hybrid import (
    DiskLimit,
    ExecTimeout,
    ExecutionError,
    ExecutionResult,
    OutOfFuel,
    OutOfMemory,
    Termination,
    TestOutcome,
    Usage,
)


def result(termination: Termination, **extra: object) -> ExecutionResult:
    return ExecutionResult(
        tier="wasm",
        termination=termination,
        exit_code=None if termination is not Termination.OK else 0,
        usage=Usage(wall_ms=1.5, fuel_used=10, peak_memory_bytes=65536),
        **extra,
    )


def test_json_round_trip() -> None:
    original = result(
        Termination.OK,
        stdout="out\n",
        stderr="é\n",
        stdout_truncated=True,
        tests=[TestOutcome(name="test_a", passed=False, message="AssertionError")],
        traceback="Traceback ...",
    )
    assert ExecutionResult.model_validate_json(original.model_dump_json()) == original


def test_exit_code_is_required() -> None:
    with pytest.raises(ValueError, match="exit_code"):
        ExecutionResult(tier="wasm", termination=Termination.OK, usage=Usage(wall_ms=1))  # type: ignore[call-arg]


def test_ok_needs_every_test_to_pass() -> None:
    assert result(Termination.OK).ok
    failing = result(Termination.OK, tests=[TestOutcome(name="t", passed=False)])
    assert not failing.ok


@pytest.mark.parametrize(
    ("termination", "error"),
    [
        (Termination.TIMEOUT, ExecTimeout),
        (Termination.OUT_OF_FUEL, OutOfFuel),
        (Termination.OUT_OF_MEMORY, OutOfMemory),
        (Termination.DISK_LIMIT, DiskLimit),
        (Termination.TRAP, ExecutionError),
    ],
)
def test_raise_for_termination(termination: Termination, error: type[Exception]) -> None:
    bad = result(termination, detail="why")
    with pytest.raises(error, match="why") as info:
        bad.raise_for_termination()
    assert info.value.result is bad  # type: ignore[attr-defined]
    assert result(Termination.OK).raise_for_termination().ok


def test_json_carries_ok_and_rounded_times_and_loads_back() -> None:
    failed = result(Termination.OK, tests=[TestOutcome(name="t", passed=False)])
    failed.usage.wall_ms = 12.3456789
    failed.usage.cpu_ms = 0.004
    data = failed.model_dump(mode="json")
    assert data["ok"] is False
    assert data["usage"]["wall_ms"] == 12.35 and data["usage"]["cpu_ms"] == 0.0
    assert failed.model_dump()["usage"]["wall_ms"] == 12.3456789  # full precision in process
    loaded = ExecutionResult.model_validate_json(failed.model_dump_json())
    assert loaded.ok is False and loaded.usage.wall_ms == 12.35
    assert result(Termination.OK).model_dump(mode="json")["ok"] is True
