"""Secret values (env.set) on a real engine: they reach the process at exec and nothing else.

The attack: anyone who can read the engine's metadata (``docker inspect``, ``docker events``, an
exported snapshot image) or a printed attach command learns every ``env.set`` value. Each check
below looks for a random canary value in one of those places.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
import time
from typing import Any

import pytest
from click.testing import CliRunner

from hybrid.cli import cli
from hybrid.errors import WorkstationError
from hybrid.policy import Budget, Environment, SandboxSpec
from hybrid.workstation import state
from hybrid.workstation.docker import client

pytestmark = pytest.mark.engine


def _spec(canary: str) -> SandboxSpec:
    return SandboxSpec(
        tier="docker",
        budget=Budget(wall_seconds=30, memory="256M", pids=64),
        env=Environment(allow=["API_TOKEN", "MODE"], set={"API_TOKEN": canary, "MODE": "test"}),
    )


def _hybrid(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from hybrid.cli import main; main()", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _engine_events(since: float, container_ids: set[str]) -> list[dict[str, Any]]:
    events = client().api.events(since=f"{since:.6f}", until=f"{time.time():.6f}", decode=True)
    return [
        e
        for e in events
        if (e.get("Actor") or {}).get("ID") in container_ids or e.get("Type") == "image"
    ]


def test_env_set_values_reach_exec_but_no_metadata(engine):
    canary = f"canary-{secrets.token_hex(8)}"
    api = client().api
    since = time.time() - 1
    name = f"secret-{os.getpid()}"
    with engine.create(_spec(canary), name=name, persistent=True) as ws:
        try:
            # The value reaches the process...
            assert ws.exec("echo $API_TOKEN $MODE").stdout == f"{canary} test\n"
            # ...but not the container's metadata: labels, create-time Config.Env, anything.
            attrs = api.inspect_container(ws.id)
            assert canary not in json.dumps(attrs)
            spec = json.loads(attrs["Config"]["Labels"]["hybrid.spec"])
            assert set(spec["env"]["set"]) == {"API_TOKEN", "MODE"}  # names stay visible
            assert ws.spec.env.set["API_TOKEN"] == state.REDACTED

            # Host side: a 0600 file in a 0700 directory.
            where = state.directory("workstations", ws.id)
            assert stat.S_IMODE(where.stat().st_mode) == 0o700
            assert stat.S_IMODE((where / state.ENV_FILE).stat().st_mode) == 0o600

            # The engine's exec records (ProcessConfig) carry no environment.
            execs = [e["Actor"]["Attributes"].get("execID") for e in _engine_events(since, {ws.id})]
            execs = [e for e in execs if e]
            assert execs
            for exec_id in execs:
                assert canary not in json.dumps(api.exec_inspect(exec_id))

            # A new handle (another process) reads the values back from the state directory.
            again = _hybrid("ws", "exec", name, "--", "sh", "-c", "echo $API_TOKEN")
            assert again.returncode == 0 and again.stdout == f"{canary}\n", again.stderr

            # The CLI: `ws ls --json` and `ws shell --json` print no value...
            runner = CliRunner()
            listed = runner.invoke(cli, ["ws", "ls", "--json"])
            assert listed.exit_code == 0 and name in listed.stdout and canary not in listed.stdout
            described = runner.invoke(cli, ["ws", "shell", name, "--json"])
            assert described.exit_code == 0, described.output
            shown = json.loads(described.stdout)
            assert canary not in described.stdout
            assert "API_TOKEN" in shown["argv"] and shown["env"] == ["API_TOKEN", "MODE"]
            # ...and `ws shell` still gives the shell the value (docker reads it from its env).
            attached = _hybrid("ws", "shell", name, "--shell", "/bin/sh", stdin="echo $API_TOKEN\n")
            assert attached.returncode == 0 and attached.stdout == f"{canary}\n", attached.stderr

            # Snapshots: the image carries no value; a start from it and a fork still have it.
            snap = ws.snapshot(f"secret-snap-{os.getpid()}")
            try:
                image = api.inspect_image(snap.image)
                assert canary not in json.dumps(image)
                assert canary not in json.dumps(api.history(snap.image))
                with engine.start(snap.name) as restored:
                    assert restored.exec("echo $API_TOKEN").stdout == f"{canary}\n"
                    assert canary not in json.dumps(api.inspect_container(restored.id))
                forks = ws.fork(2)
                try:
                    for fork in forks:
                        assert fork.exec("echo $API_TOKEN").stdout == f"{canary}\n"
                        assert canary not in json.dumps(api.inspect_container(fork.id))
                    fork_image = api.inspect_container(forks[0].id)["Config"]["Image"]
                    assert canary not in json.dumps(api.inspect_image(fork_image))
                finally:
                    for fork in forks:
                        fork.remove()
                    assert not (state.state_dir("workstations") / forks[0].id).exists()
            finally:
                engine.remove_snapshot(snap.name)
            assert not (state.state_dir("snapshots") / snap.id.rpartition(":")[2]).exists()

            # Every event the engine recorded for all of the above: no value.
            assert canary not in json.dumps(_engine_events(since, {ws.id}))
        finally:
            ws.remove()
    assert not (state.state_dir("workstations") / ws.id).exists()


def test_missing_values_fail_at_exec_instead_of_running_without(engine, tmp_path, monkeypatch):
    canary = f"canary-{secrets.token_hex(8)}"
    name = f"secret-away-{os.getpid()}"
    with engine.create(_spec(canary), name=name, persistent=True) as ws:
        try:
            # Another user or host: its state directory does not hold this workstation's values.
            monkeypatch.setenv("HYBRID_STATE_DIR", str(tmp_path / "elsewhere"))
            away = engine.open(name)
            with pytest.raises(WorkstationError, match="API_TOKEN, MODE"):
                away.exec("echo $API_TOKEN")
            with pytest.raises(WorkstationError):
                away.attach_command("/bin/sh")
            cli_run = _hybrid("ws", "exec", name, "--", "true")
            assert cli_run.returncode == 6
            assert cli_run.stderr.count("\n") == 1 and "Traceback" not in cli_run.stderr
            monkeypatch.undo()
            assert engine.open(name).exec("echo $API_TOKEN").stdout == f"{canary}\n"
        finally:
            ws.remove()
