"""Hostile guests, run for real under wasmtime: every case must stop, stay inside and clean up."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from hybrid import ModuleError, PolicyViolation, SandboxSpec, Termination
from hybrid.policy import Budget, Mount
from hybrid.wasm import run

pytestmark = pytest.mark.usefixtures("run_dirs")


def spec(**budget: object) -> SandboxSpec:
    return SandboxSpec(tier="wasm", budget=Budget(**budget))


def test_infinite_loop_stops_on_fuel(probe: Path) -> None:
    result = run(probe, ["spin", ""], spec=spec(fuel=50_000_000, wall_seconds=30))
    assert result.termination is Termination.OUT_OF_FUEL
    assert result.usage.fuel_used == 50_000_000
    assert result.exit_code is None
    assert result.usage.wall_ms < 5_000


def test_infinite_loop_stops_on_deadline(probe: Path) -> None:
    started = time.monotonic()
    result = run(probe, ["spin", ""], spec=spec(fuel=10**13, wall_seconds=0.3))
    elapsed = time.monotonic() - started
    assert result.termination is Termination.TIMEOUT
    assert 0.25 < elapsed < 2.0


def test_sleeping_guest_stops_on_deadline(probe: Path) -> None:
    started = time.monotonic()
    result = run(probe, ["sleep", "30"], spec=spec(wall_seconds=0.4))
    assert result.termination is Termination.TIMEOUT
    assert time.monotonic() - started < 2.0


def test_short_sleep_within_budget_completes(probe: Path) -> None:
    result = run(probe, ["sleep", "0", "exit", "3"], spec=spec(wall_seconds=5))
    assert result.termination is Termination.NONZERO_EXIT
    assert result.exit_code == 3


def test_memory_bomb_stops_at_cap(probe: Path) -> None:
    result = run(probe, ["alloc", "300"], spec=spec(memory="64M"))
    assert result.termination is Termination.OUT_OF_MEMORY
    assert result.usage.peak_memory_bytes is not None
    assert result.usage.peak_memory_bytes <= 64 * 1024**2
    assert "alloc ok" not in result.stdout


def test_allocation_within_cap_succeeds(probe: Path) -> None:
    result = run(probe, ["alloc", "16"], spec=spec(memory="64M"))
    assert result.ok, result
    assert "alloc ok 16 MiB" in result.stdout


def test_module_whose_minimum_memory_exceeds_cap(tmp_path: Path) -> None:
    module = tmp_path / "big.wat"
    module.write_text(
        '(module (memory (export "memory") 200) (func (export "_start")))'
    )  # 12.5 MiB
    result = run(module, spec=spec(memory="4M"))
    assert result.termination is Termination.OUT_OF_MEMORY


def test_writes_outside_scratch_fail(probe: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    mounted = SandboxSpec(tier="wasm", mounts=[Mount(source=data, target="/data")])
    result = run(
        probe, ["write", "/etc/evil", "write", "/data/evil", "write", "/workspace/ok"], spec=mounted
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith("write denied"), lines
    assert lines[1].startswith("write denied"), lines
    assert lines[2] == "write ok"
    assert list(data.iterdir()) == []


def test_scratch_is_private_to_each_run(probe: Path) -> None:
    first = run(probe, ["write", "/workspace/left-over", "list", "/workspace"])
    assert "list ok: left-over" in first.stdout
    second = run(probe, ["list", "/workspace"])
    assert second.stdout.strip() == "list ok:"


def test_host_paths_not_granted_are_invisible(probe: Path) -> None:
    result = run(
        probe,
        ["read", "/etc/passwd", "list", "/", "list", "/etc", "read", str(Path.home() / ".bashrc")],
    )
    assert result.stdout.count("denied") == 4, result.stdout
    assert "root:" not in result.stdout


def test_dotdot_and_symlink_escapes_fail(probe: Path, tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "inside.txt").write_text("fine")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    (granted / "relative-link").symlink_to("../secret.txt")
    (granted / "absolute-link").symlink_to(secret)
    (granted / "etc-link").symlink_to("/etc/passwd")
    (granted / "dir-link").symlink_to(tmp_path)
    mounted = SandboxSpec(tier="wasm", mounts=[Mount(source=granted, target="/in")])
    args = [
        "read", "/in/inside.txt",
        "read", "/in/../secret.txt",
        "read", "/in/../../etc/passwd",
        "read", "/in/relative-link",
        "read", "/in/absolute-link",
        "read", "/in/etc-link",
        "read", "/in/dir-link/secret.txt",
        "list", "/in/..",
    ]  # fmt: skip
    result = run(probe, args, spec=mounted)
    lines = result.stdout.splitlines()
    assert lines[0] == "read ok 4 bytes: fine"
    assert all("denied" in line for line in lines[1:]), lines
    assert "TOP-SECRET" not in result.stdout and "root:" not in result.stdout


def test_output_flood_is_truncated_and_flagged(probe: Path) -> None:
    result = run(probe, ["flood", ""], spec=spec(output_bytes="64k", wall_seconds=20))
    assert result.termination is Termination.OUTPUT_LIMIT
    assert result.stdout_truncated
    assert len(result.stdout.encode()) == 64 * 1024
    assert result.usage.wall_ms < 5_000  # the guest stopped at the cut, not at its deadline


def test_environment_is_explicit(probe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST_SECRET", "leak")
    result = run(probe, ["env", ""])
    assert result.stdout.strip() == "env:"
    allowed = SandboxSpec(tier="wasm", env={"allow": ["GREETING"], "set": {"GREETING": "hi"}})
    assert run(probe, ["env", ""], spec=allowed).stdout.strip() == "env: GREETING=hi"


def test_stdin_bytes(probe: Path) -> None:
    assert run(probe, ["stdin", ""], stdin=b"from host").stdout.strip() == "stdin: from host"


def test_policy_is_enforced_before_running(probe: Path) -> None:
    hostile = SandboxSpec(tier="wasm", mounts=[Mount(source=Path("~/.ssh"), target="/keys")])
    with pytest.raises(PolicyViolation, match="secret path"):
        run(probe, ["list", "/keys"], spec=hostile)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00asm\x01\x00\x00\x00\xff\xff", "not a valid WebAssembly module"),
        (b"this is not wasm", "not a WebAssembly module"),
        (b'(module (func (export "main")))', "no _start export"),
    ],
)
def test_malformed_modules_give_clear_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.wasm"
    path.write_bytes(content)
    with pytest.raises(ModuleError, match=message):
        run(path)


def test_missing_module(tmp_path: Path) -> None:
    with pytest.raises(ModuleError, match="no such file"):
        run(tmp_path / "absent.wasm")


def test_many_threads_share_engine_and_cache(probe: Path) -> None:
    results: list[str] = []
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(10):
                out = run(probe, ["stdin", ""], stdin=f"{n}-{i}".encode())
                results.append(out.stdout.strip())
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(results) == sorted(f"stdin: {n}-{i}" for n in range(8) for i in range(10))


def test_compiled_module_cache_is_on_disk(probe: Path) -> None:
    from hybrid.wasm.cache import CACHE

    run(probe, ["exit", "0"])
    key = CACHE.key(probe.read_bytes())
    assert (CACHE.directory / f"{key}.module").exists()
    assert os.path.getsize(CACHE.directory / f"{key}.module") > 0


def test_nothing_left_after_the_process_exits(probe: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    private = tmp_path / "proc-tmp"
    private.mkdir()
    code = (
        "import sys; from hybrid.wasm import run; "
        "[run(sys.argv[1], ['write', '/workspace/f', 'exit', '0']) for _ in range(3)]; "
        "run(sys.argv[1], ['spin', ''], spec=__import__('hybrid').SandboxSpec(budget={'fuel': 1000}))"
    )
    env = {**os.environ, "TMPDIR": str(private)}
    subprocess.run([sys.executable, "-c", code, str(probe)], check=True, env=env, timeout=60)
    assert list(private.iterdir()) == []


def test_scratch_fill_stops_at_the_disk_cap(probe: Path) -> None:
    """A guest writing 256 MiB into its scratch stops at the 64 MiB default cap, with its output."""
    from hybrid.wasm.runtime import scratch_capped

    assert scratch_capped(), "the scratch cap needs mount rights (run as root)"
    result = run(probe, ["write", "/workspace/keep", "fill", "/workspace/big"])
    assert result.termination is Termination.DISK_LIMIT, result
    assert result.exit_code == 1
    assert "budget.disk" in result.detail and "64M" in result.detail
    lines = result.stdout.splitlines()
    assert lines[0] == "write ok"  # partial output is kept
    stopped = int(lines[1].split()[3])
    assert lines[1].startswith("fill stopped after") and 56 <= stopped < 64, lines


def test_many_small_files_stop_at_the_disk_cap(probe: Path) -> None:
    result = run(probe, ["files", "/workspace"], spec=spec(disk="8M"))
    assert result.termination is Termination.DISK_LIMIT, result
    made = int(result.stdout.split()[3].rstrip(":"))
    assert 1000 < made <= 2048, result.stdout  # 8 MiB of 4 KiB files, or the inodes to match


def test_a_larger_disk_cap_is_honoured(probe: Path) -> None:
    result = run(probe, ["fill", "/workspace/big"], spec=spec(disk="300M", wall_seconds=30))
    assert result.termination is Termination.OK, result
    assert result.stdout.strip() == "fill wrote 256 MiB"
    capped = run(probe, ["fill", "/workspace/big"], spec=spec(disk="16M"))
    assert capped.termination is Termination.DISK_LIMIT
    assert "16M" in capped.detail


def test_full_scratch_is_gone_after_the_run(probe: Path) -> None:
    """The filled tmpfs is released with the run: the next run starts empty, nothing is mounted."""
    run(probe, ["fill", "/workspace/big"])
    assert "hybrid-scratch" not in Path("/proc/self/mountinfo").read_text()
    again = run(probe, ["list", "/workspace"])
    assert again.stdout.strip() == "list ok:"
