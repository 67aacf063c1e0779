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


def test_finish_result_output_cut_replaces_any_ending_where_the_cap_closes_the_stream() -> None:
    from hybrid.results import finish_result

    for ending in Termination:
        closed = finish_result(
            "wasm",
            ending,
            None,
            stdout=b"x" * 4,
            stdout_truncated=True,
            output_bytes=4,
            wall_ms=1.0,
            detail="why",
            output_cap_closes=True,
        )
        assert closed.termination is Termination.OUTPUT_LIMIT, ending
        assert closed.detail == "output over 4 bytes was cut"
        assert closed.stdout == "xxxx" and closed.stdout_truncated


def test_finish_result_output_cut_replaces_only_a_process_own_ending() -> None:
    from hybrid.results import finish_result

    for ending in Termination:
        kept = finish_result(
            "docker",
            ending,
            1,
            stderr=b"e",
            stderr_truncated=True,
            output_bytes=1,
            wall_ms=1.0,
            detail="why",
        )
        if ending in (Termination.OK, Termination.NONZERO_EXIT):
            assert (kept.termination, kept.detail) == (
                Termination.OUTPUT_LIMIT,
                "output over 1 bytes was cut",
            )
        else:
            assert (kept.termination, kept.detail) == (ending, "why"), ending
        assert kept.exit_code == 1


def test_finish_result_zero_fuel_after_an_interrupt_is_unknown() -> None:
    from hybrid.results import finish_result

    def fuel(ending: Termination, used: int | None) -> int | None:
        return finish_result(
            "wasm", ending, None, output_bytes=1, wall_ms=1.0, fuel_used=used
        ).usage.fuel_used

    assert fuel(Termination.TIMEOUT, 0) is None
    assert fuel(Termination.TIMEOUT, 5) == 5
    assert fuel(Termination.OK, 0) == 0
    assert fuel(Termination.OUT_OF_FUEL, 7) == 7


def test_finish_result_decodes_and_keeps_everything_else() -> None:
    from hybrid.results import finish_result

    done = finish_result(
        "python-wasm",
        Termination.NONZERO_EXIT,
        1,
        stdout=bytearray(b"ok\xff"),
        stderr="text",
        output_bytes=10,
        wall_ms=2.5,
        detail="1 of 1 tests failed",
        peak_memory_bytes=64,
        cpu_ms=1.0,
        tests=[TestOutcome(name="t", passed=False)],
        traceback="tb",
    )
    assert done.stdout == "ok\ufffd" and done.stderr == "text"
    assert (done.termination, done.exit_code, done.detail) == (
        Termination.NONZERO_EXIT,
        1,
        "1 of 1 tests failed",
    )
    assert done.usage == Usage(wall_ms=2.5, peak_memory_bytes=64, cpu_ms=1.0)
    assert done.tests == [TestOutcome(name="t", passed=False)] and done.traceback == "tb"


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
