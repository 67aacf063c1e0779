"""Per-command metrics from the sandbox's cgroup, on the real engine, under runc and runsc.

Bounds are loose on purpose: two cores shared with other work. The CPU check compares the
cgroup with the process's own CPU clock (which load does not inflate), not with wall time.
"""

from __future__ import annotations

import json

import pytest

from hybrid.results import Termination

pytestmark = pytest.mark.engine

MiB = 1024**2
# Spins until the process itself has used 1 s of CPU, whatever the machine's load.
BURN = "import time\nwhile time.process_time() < 1.0: pass"


def test_cpu_bound_command_shows_its_cpu_seconds(engine, tier, make_spec):
    with engine.create(make_spec(tier, memory="256M")) as ws:
        result = ws.exec(["python3", "-c", BURN])
        assert result.ok, result.stderr
        usage = result.usage
        assert usage.cpu_user_seconds is not None and usage.cpu_system_seconds is not None
        cpu = usage.cpu_user_seconds + usage.cpu_system_seconds
        # runc: at least the second the process counted, at most that plus interpreter start.
        # gVisor's guest clock also counts time its stubs wait for a host CPU, so on a loaded
        # host the sandbox's cgroup (the truth) can show less than the guest believes it used.
        floor = 0.95 if tier == "docker" else 0.4
        assert floor <= cpu <= 2.5, usage
        assert cpu <= usage.wall_ms / 1000 * 1.0 + 0.3, usage  # one core (budget.cpus)
        assert usage.cpu_ms == pytest.approx(cpu * 1000)
        assert usage.cpu_throttled_seconds is not None and usage.oom_events == 0
        assert usage.block_read_bytes is not None and usage.block_write_bytes is not None

        # The next command's usage is its own (a delta), not the workstation's total.
        idle = ws.exec("true").usage
        assert idle.cpu_user_seconds is not None and idle.cpu_system_seconds is not None
        idle_cpu = idle.cpu_user_seconds + idle.cpu_system_seconds
        assert idle_cpu < 0.5 and idle_cpu * 3 < cpu, (idle, usage)


def test_memory_hungry_command_shows_its_peak(engine, tier, make_spec):
    with engine.create(make_spec(tier, memory="512M")) as ws:
        touch = "x = bytearray(200 * 1024 * 1024)\nfor i in range(0, len(x), 4096): x[i] = 1"
        hungry = ws.exec(["python3", "-c", touch])
        assert hungry.ok, hungry.stderr
        peak = hungry.usage.peak_memory_bytes
        assert peak is not None and 200 * MiB <= peak <= 512 * MiB, peak
        small = ws.exec("true").usage.peak_memory_bytes
        assert small is not None
        if tier == "docker":
            # runc: the peak is reset around each command. (gVisor's sentry keeps the memory it
            # once took, so its group's usage, and a fresh peak, stay high.)
            assert small < 100 * MiB, small


def test_oom_shows_the_event(engine, tier, make_spec):
    with engine.create(make_spec(tier, memory="128M")) as ws:
        result = ws.exec(["python3", "-c", "x = bytearray(400 * 1024 * 1024)"])
        assert result.termination is Termination.OUT_OF_MEMORY, result
        assert result.usage.oom_events is not None and result.usage.oom_events >= 1
        assert result.usage.peak_memory_bytes is not None
        assert result.usage.peak_memory_bytes >= 100 * MiB
        if tier == "docker":
            # The workstation lives on (the kernel killed one process): the next command
            # counts no OOM of its own.
            after = ws.exec("true")
            assert after.ok and after.usage.oom_events == 0


def test_metrics_in_cli_json_and_plain_output(engine, make_spec, hybrid_cli):
    with engine.create(make_spec("docker")) as ws:
        code, out, _ = hybrid_cli("ws", "exec", ws.name, "--json", "--", "python3", "-c", BURN)
        assert code == 0
        usage = json.loads(out)["usage"]
        for key in (
            "cpu_user_seconds",
            "cpu_system_seconds",
            "peak_memory_bytes",
            "oom_events",
            "block_read_bytes",
            "block_write_bytes",
            "cpu_throttled_seconds",
        ):
            assert usage[key] is not None, key
        assert usage["cpu_user_seconds"] + usage["cpu_system_seconds"] >= 0.95
        code, _, err = hybrid_cli("ws", "exec", ws.name, "--", "true")
        assert code == 0
        assert "s user" in err and "s sys" in err and "peak " in err, err


def test_metrics_follow_a_restart_by_another_party(engine, tier, make_spec):
    # The workstation remembers its init's pid to find the cgroup without asking the engine;
    # a restart from outside (a new init, the old pid gone or reused) must not lose or mix up
    # the counters.
    from hybrid.workstation.docker.engine import client

    with engine.create(make_spec(tier, memory="256M")) as ws:
        assert ws.exec("true").usage.cpu_user_seconds is not None
        client().api.restart(ws.id, timeout=0)
        result = ws.exec(["python3", "-c", BURN])
        assert result.ok, result.stderr
        usage = result.usage
        assert usage.cpu_user_seconds is not None and usage.cpu_system_seconds is not None
        assert usage.cpu_user_seconds + usage.cpu_system_seconds >= 0.4, usage
