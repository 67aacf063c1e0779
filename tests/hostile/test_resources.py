"""Resource attacks on every tier: each must stop on its budget, on time, with a typed termination."""

from __future__ import annotations

import contextlib
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hostile_kit import Attack, Driver, Row, WorkstationDriver, damaging

from hybrid.results import ExecutionResult, Termination

pytestmark = pytest.mark.timeout(300)

# WASI preview 1 has no call that makes a process: a module asking for one does not link.
FORK_MODULE = """(module
  (import "wasi_snapshot_preview1" "proc_fork" (func $fork (result i32)))
  (memory (export "memory") 1)
  (func (export "_start") (loop $l (drop (call $fork)) (br $l))))"""

SPAWN_ATTEMPTS = """
import os
attempts = {
    "fork": lambda: os.fork(),
    "spawn": lambda: __import__("subprocess").Popen(["/bin/sh", "-c", "true"]),
    "posix_spawn": lambda: os.posix_spawn("/bin/sh", ["sh"], {}),
    "thread": lambda: __import__("threading").Thread(target=lambda: None).start(),
}
for name, attempt in attempts.items():
    try:
        attempt()
        print(name, "ok")
    except Exception as exc:
        print(name, "unavailable:", type(exc).__name__)
"""


def timed(run: object) -> tuple[ExecutionResult, float]:
    started = time.monotonic()
    result = run()  # type: ignore[operator]
    return result, time.monotonic() - started


def test_fork_bomb(sandbox: Driver) -> None:
    if sandbox.kind == "wasi":
        result = sandbox.run(Attack(module=FORK_MODULE))
        assert result.termination is Termination.ERROR, result
        assert "proc_fork" in result.detail or "unknown import" in result.detail, result.detail
        return
    if sandbox.kind == "python":
        result = sandbox.run(Attack(python=SPAWN_ATTEMPTS))
        lines = result.stdout.splitlines()
        assert [line.split()[1] for line in lines[:3]] == ["unavailable:"] * 3, result
        return
    attack = Attack(shell="b() { b | b & }; b; sleep 30")
    result, elapsed = timed(lambda: damaging(sandbox, attack, wall_seconds=3, pids=64))
    # runc: the pids cap makes fork fail (the shell gives up, or the deadline ends it); gVisor:
    # a pids breach kills the whole sandbox, and so can the memory cap its sentry reaches
    # first on a slow host (each forked shell costs the sentry memory of its own).
    contained = {Termination.TIMEOUT, Termination.ERROR, Termination.NONZERO_EXIT}
    if sandbox.tier == "gvisor":
        contained.add(Termination.OUT_OF_MEMORY)
    assert result.termination in contained, result
    assert elapsed < 3 + sandbox.slack


def test_memory_bomb(sandbox: Driver) -> None:
    attack = Attack(
        wasi=["alloc", "512"],
        python="blocks = []\nwhile True:\n    blocks.append(bytearray(8 << 20))\n",
        shell="exec python3 -c 'import itertools; b = [bytearray(16 << 20) for _ in itertools.count()]'",
    )
    result, elapsed = timed(lambda: sandbox.run(attack, memory="128M", wall_seconds=20))
    assert result.termination is Termination.OUT_OF_MEMORY, result
    assert elapsed < 20


def test_cpu_loop(sandbox: Driver) -> None:
    attack = Attack(
        wasi=["spin", ""], python="while True:\n    pass\n", shell="while :; do :; done"
    )
    result, elapsed = timed(lambda: sandbox.run(attack, wall_seconds=2))
    assert result.termination is Termination.TIMEOUT, result
    assert elapsed < 2 + sandbox.slack


def test_sleep(sandbox: Driver) -> None:
    # python-wasm: the interpreter's own sleep, unpatched by the harness, where the guest has it.
    real_sleep = (
        "import sys, time\n"
        "sleep = getattr(sys.modules.get('app'), '_real_sleep', None) or time.sleep\n"
        "sleep(30)\n"
    )
    attack = Attack(wasi=["sleep", "30"], python=real_sleep, shell="sleep 30")
    result, elapsed = timed(lambda: sandbox.run(attack, wall_seconds=2))
    assert result.termination is Termination.TIMEOUT, result
    assert elapsed < 2 + sandbox.slack


def test_output_flood(sandbox: Driver) -> None:
    attack = Attack(
        wasi=["flood", ""], python="while True:\n    print('x' * 1023)\n", shell="yes xxxxxxxx"
    )
    result, elapsed = timed(lambda: sandbox.run(attack, wall_seconds=8, output_bytes="64k"))
    assert result.stdout_truncated
    assert 0 < len(result.stdout.encode()) <= 64 * 1024
    if sandbox.kind in ("wasi", "python"):
        # In process the pipe closes at the cap: the guest gets EPIPE and stops.
        assert result.termination is Termination.OUTPUT_LIMIT, result.termination
        assert elapsed < 8, "the flood ran to its deadline instead of stopping at the output cap"
    else:
        # A process tier keeps what fits and drops the rest: output_bytes bounds what is kept, not
        # how long a job may print (a verbose test run still reaches its end), so a command that
        # never stops is ended by its deadline.
        assert result.termination in (Termination.OUTPUT_LIMIT, Termination.TIMEOUT), result
        assert elapsed < 8 + sandbox.slack


def test_invalid_utf8_output(sandbox: Driver) -> None:
    attack = Attack(
        wasi=["raw", ""],
        python="import sys\nsys.stdout.buffer.write(b'raw \\xff\\xfe\\xc3 end\\n')\n",
        shell=r"printf 'raw \377\376\303 end\n'",
    )
    result = sandbox.run(attack)
    assert result.ok, result
    assert result.stdout.startswith("raw ") and result.stdout.endswith(" end\n"), result.stdout
    assert "\ufffd" in result.stdout
    # JSON rounds times to 0.01 ms (issue 13): the output itself must come back exactly, and
    # the JSON form must be a fixed point of the round trip.
    loaded = ExecutionResult.model_validate_json(result.model_dump_json())
    assert (loaded.stdout, loaded.stderr) == (result.stdout, result.stderr)
    assert loaded.model_dump_json() == result.model_dump_json()


def test_disk_fill(sandbox: Driver) -> None:
    if sandbox.kind == "python":
        # No writable directory at all: the disk cannot fill (the budget is still accepted).
        attack = Attack(
            python=(
                "for path in ('fill', '/fill', '/tmp/fill'):\n"
                "    try:\n"
                "        open(path, 'wb').write(b'x' * (1 << 20))\n"
                "        print(path, 'write ok')\n"
                "    except OSError as exc:\n"
                "        print(path, 'write denied:', type(exc).__name__)\n"
            )
        )
        result = sandbox.run(attack, disk="64M")
        assert result.stdout.count("write denied") == 3, result
        return
    attack = Attack(
        wasi=["print", "fill start", "fill", "/workspace/fill"],
        # dd's own status is the run's: the cap makes it fail with ENOSPC.
        shell="echo fill start; dd if=/dev/zero of=fill bs=1M count=256",
    )
    result = damaging(sandbox, attack, disk="64M", wall_seconds=20)
    assert result.termination is Termination.DISK_LIMIT, result.termination  # type: ignore[attr-defined]
    assert "fill start" in result.stdout, "partial output is kept"
    if sandbox.kind == "process":
        copied = re.search(r"(\d+) bytes", result.stderr)
        assert copied and int(copied.group(1)) <= 64 * 1024**2, result.stderr


def test_concurrency_20(sandbox: Driver, row: Row) -> None:
    with contextlib.ExitStack() as stack:
        ws = None
        if isinstance(sandbox, WorkstationDriver):
            # 20 execs at once in one workstation share its pids budget: each is its job (sh +
            # sleep) plus the exec's watchdog (sh + timeout), so 80 processes need more than 64.
            ws = stack.enter_context(sandbox.fresh(pids=128))

        def job(i: int) -> ExecutionResult:
            attack = Attack(
                wasi=["print", f"job-{i}", "sleep", "1", "print", f"done-{i}"],
                python=f"import time\nprint('job-{i}')\ntime.sleep(1)\nprint('done-{i}')\n",
                shell=f"echo job-{i}; sleep 1; echo done-{i}",
            )
            wall = 60 if sandbox.kind == "process" else 20
            if ws is not None:
                return sandbox.run(attack, ws=ws, wall_seconds=wall)
            return sandbox.run(attack, wall_seconds=wall)

        with ThreadPoolExecutor(20) as pool:
            results = list(pool.map(job, range(20)))
        if ws is not None:
            assert sandbox.run(Attack(shell="echo still-up"), ws=ws).stdout == "still-up\n"
    endings = sorted({r.termination.value for r in results})
    row.note(" ".join(f"{t} x{sum(r.termination.value == t for r in results)}" for t in endings))
    for i, result in enumerate(results):
        assert result.ok, (i, result)
        assert result.stdout == f"job-{i}\ndone-{i}\n", (i, result.stdout)
