"""The workstation API and CLI on a real engine (runc): files, env, output bounds, CLI state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hybrid.cli import cli
from hybrid.errors import InvalidInput, PolicyViolation, WorkstationError, WorkstationNotFound
from hybrid.policy import Environment, NetworkPolicy, SandboxSpec
from hybrid.results import Termination
from hybrid.workstation import Workstation
from hybrid.workstation.jobuser import JOB_UID

pytestmark = pytest.mark.engine


def test_put_get_and_streaming_output(engine, make_spec, tmp_path):
    with engine.create(make_spec("docker")) as ws:
        assert isinstance(ws, Workstation)
        ws.put(b"hello\n", "notes/a.txt")
        (tmp_path / "tree" / "sub").mkdir(parents=True)
        (tmp_path / "tree" / "sub" / "b.txt").write_text("bee\n")
        ws.put(tmp_path / "tree", "tree")
        assert ws.get("notes/a.txt") == b"hello\n"
        assert ws.exec("cat tree/sub/b.txt && echo more >> notes/a.txt").stdout == "bee\n"
        ws.get("notes", tmp_path / "out")
        assert (tmp_path / "out" / "notes" / "a.txt").read_text() == "hello\nmore\n"
        with pytest.raises(InvalidInput):
            ws.put(b"x", "/etc/passwd")

        chunks: list[tuple[str, bytes]] = []
        result = ws.exec(
            "echo one; echo two >&2", on_output=lambda kind, data: chunks.append((kind, data))
        )
        assert result.ok and result.stdout == "one\n" and result.stderr == "two\n"
        assert b"".join(d for k, d in chunks if k == "stdout") == b"one\n"
        assert b"".join(d for k, d in chunks if k == "stderr") == b"two\n"

        failing = ws.exec("exit 7")
        assert failing.termination is Termination.NONZERO_EXIT and failing.exit_code == 7
        ws.remove()
        ws.remove()  # idempotent: a second remove finds nothing and says nothing
        ws.close()
        assert ws.name not in [w.name for w in engine.list()]


def test_output_is_bounded_with_truncation_flags(engine, make_spec):
    with engine.create(make_spec("docker", output_bytes="1k")) as ws:
        result = ws.exec("head -c 100000 /dev/zero | tr '\\0' x")
        assert result.termination is Termination.OUTPUT_LIMIT
        assert result.stdout_truncated and not result.stderr_truncated
        assert len(result.stdout) == 1024


def test_only_allow_listed_environment(engine):
    spec = SandboxSpec(
        tier="docker", env=Environment(allow=["MODE", "EXTRA"], set={"MODE": "test"})
    )
    with engine.create(spec) as ws:
        env = ws.exec("env").stdout
        assert "MODE=test" in env
        assert ws.exec("echo $EXTRA", env={"EXTRA": "yes"}).stdout == "yes\n"
        with pytest.raises(PolicyViolation):
            ws.exec("true", env={"OTHER": "no"})


def test_refusals_are_typed(engine):
    with pytest.raises(PolicyViolation):
        engine.create(
            SandboxSpec(
                tier="gvisor", network=NetworkPolicy(mode="egress", allow=["index.example.com"])
            )
        )
    with pytest.raises(PolicyViolation):
        engine.create(SandboxSpec(tier="docker", network=NetworkPolicy(mode="egress")))
    with pytest.raises(WorkstationNotFound):
        engine.open("no-such-workstation")
    with pytest.raises(WorkstationNotFound):
        engine.create(SandboxSpec(tier="docker"), image="hybrid/not-an-image:none")
    with pytest.raises(InvalidInput):
        engine.create(SandboxSpec(tier="docker"), name="Bad Name")
    with engine.create(SandboxSpec(tier="docker")) as ws, pytest.raises(WorkstationError):
        engine.create(SandboxSpec(tier="docker"), name=ws.name)


def _hybrid(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from hybrid.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ},
    )


def test_cli_state_survives_between_processes(tmp_path: Path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "hello.py").write_text("print('hello')\n")
    up = _hybrid("ws", "up", "--repo", str(repo), "--json")
    if up.returncode == 5 and os.environ.get("HYBRID_REQUIRE_ENGINE") != "1":
        pytest.skip(up.stderr)
    assert up.returncode == 0, up.stderr
    name = json.loads(up.stdout)["name"]
    try:
        listed = json.loads(_hybrid("ws", "ls", "--json").stdout)
        assert name in [w["name"] for w in listed["workstations"]]
        ran = _hybrid("ws", "exec", name, "--", "python3", "hello.py")
        assert ran.returncode == 0 and ran.stdout == "hello\n", ran.stderr
        edited = _hybrid("ws", "exec", name, "--", 'sh -c "echo \\"print(\'bye\')\\" >> hello.py"')
        assert edited.returncode == 0, edited.stderr
        assert _hybrid("ws", "exec", name, "--", "sh", "-c", "exit 9").returncode == 9
        diff = _hybrid("ws", "diff", name)
        assert "+print('bye')" in diff.stdout, diff
        copied = _hybrid("ws", "cp", f"{name}:hello.py", str(tmp_path / "back"))
        assert copied.returncode == 0 and (tmp_path / "back" / "hello.py").read_text().endswith(
            "print('bye')\n"
        )
    finally:
        down = _hybrid("ws", "down", name)
    assert down.returncode == 0, down.stderr
    missing = _hybrid("ws", "exec", name, "--", "true")
    assert missing.returncode == 6
    assert missing.stderr.startswith("hybrid: error:") and "Traceback" not in missing.stderr


def test_cli_run_returns_the_command_status(engine):
    runner = CliRunner()
    result = runner.invoke(
        cli, ["run", "--tier", "docker", "--json", "--", "sh", "-c", "echo out; exit 3"]
    )
    assert result.exit_code == 3, result.output
    payload = json.loads(result.stdout)
    assert payload["route"]["tier"] == "docker"
    assert payload["result"]["stdout"] == "out\n"
    assert payload["result"]["exit_code"] == 3


def test_shell_attaches_to_a_running_workstation(engine):
    with engine.create(SandboxSpec(tier="docker"), name=f"shell-{os.getpid()}") as ws:
        ws.put(b"state kept\n", "note.txt")
        attached = _hybrid_input(
            "cat note.txt; id -u; pwd\n", "ws", "shell", ws.name, "--shell", "/bin/sh"
        )
        assert attached.returncode == 0, attached.stderr
        assert attached.stdout.splitlines() == ["state kept", str(JOB_UID), "/workspace"]
        described = _hybrid("ws", "shell", ws.name, "--json")
        assert described.returncode == 0, described.stderr
        argv = json.loads(described.stdout)["argv"]
        assert argv[0].endswith("docker") and argv[1:3] == ["exec", "-it"] and ws.id in argv


def _hybrid_input(stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from hybrid.cli import main; main()", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_any_image_and_workspace_path(engine, tmp_path):
    """A user's own image (not built here) and a workspace path it does not have still work."""
    from hybrid.workstation.docker import client
    from hybrid.workstation.images import BASE_IMAGE

    api = client().api
    tag = f"hybrid-test-custom:{os.getpid()}"
    made = api.create_container(BASE_IMAGE, command=["true"], labels={"hybrid.managed": "1"})
    api.commit(
        made["Id"],
        repository=tag.split(":")[0],
        tag=tag.split(":")[1],
        conf={"Labels": {"hybrid.kind": "custom"}},
    )
    api.remove_container(made["Id"])
    (tmp_path / "src.txt").write_text("from the host\n")
    try:
        spec = SandboxSpec(tier="docker", workspace="/srv/job")
        with engine.create(spec, image=tag, repo=tmp_path) as ws:
            result = ws.exec("pwd; id -u; cat src.txt; echo new > made.txt")
            assert result.stdout == f"/srv/job\n{JOB_UID}\nfrom the host\n", result
            assert "+new" in ws.diff()
    finally:
        api.remove_image(tag, force=True)


EGRESS_PROBE = """
import socket, sys, urllib.request
for url in sys.argv[1:]:
    try:
        print(url, urllib.request.urlopen(url, timeout=20).status)
    except Exception as e:
        print(url, type(e).__name__, getattr(e, "code", ""))
try:
    socket.create_connection(("1.1.1.1", 80), timeout=3)
    print("direct connected")
except OSError:
    print("direct refused")
"""


def test_egress_reaches_only_the_allow_list(engine):
    """network.mode = egress: a proxy on an internal network forwards to the allow-list only."""
    from urllib.parse import urlsplit

    from hybrid.workstation.docker import client
    from hybrid.workstation.images import find_mirror

    mirror = find_mirror()  # this machine's own Debian mirror: reachable wherever apt works
    host = urlsplit(mirror).hostname
    spec = SandboxSpec(tier="docker", network=NetworkPolicy(mode="egress", allow=[f"{host}:80"]))
    allowed = f"{mirror}/dists/bookworm/Release"
    denied = "http://example.invalid/"
    with engine.create(spec) as ws:
        result = ws.exec(["python3", "-c", EGRESS_PROBE, allowed, denied], timeout=60)
        assert result.ok, result
        lines = result.stdout.splitlines()
        assert lines[0] == f"{allowed} 200", lines
        assert lines[1] == f"{denied} HTTPError 403", lines
        assert lines[2] == "direct refused"
        name = ws.name
    api = client().api
    assert not api.containers(all=True, filters={"name": f"hybrid-{name}-proxy"})
    assert not api.networks(names=[f"hybrid-{name}-net"])


def test_ws_up_shows_plain_progress_without_a_terminal(engine, hybrid_cli, monkeypatch, tmp_path):
    """`ws up` with stderr on a pipe: a plain line while it starts, one when it is up."""
    import hybrid.cli._progress

    monkeypatch.setattr(hybrid.cli._progress, "DELAY", 0.0)
    name = f"progress-{os.getpid()}"
    (tmp_path / "a.txt").write_text("a\n")
    code, out, err = hybrid_cli("ws", "up", name, "--repo", str(tmp_path), "--json")
    try:
        assert code == 0, err
        assert json.loads(out)["name"] == name
        lines = err.splitlines()
        assert lines[0] == f"hybrid: starting a docker workstation with a copy of {tmp_path} ...", (
            err
        )
        assert lines[-1].startswith("hybrid: starting a docker workstation"), err
        assert ": done in " in lines[-1], err
    finally:
        engine.open(name).remove()


def test_ws_allow_env_and_ls_keeps_whole_names(engine, tmp_path):
    """`ws up --allow-env FOO` lets `ws exec -e FOO=bar` set it (others are refused with the way
    out); `ws ls` prints a long name whole, even on a narrow, non-terminal output."""
    name = (f"allow-env-{os.getpid()}-" + "n" * 63)[:63]  # the longest name there is
    up = _hybrid("ws", "up", name, "--allow-env", "FOO")
    try:
        assert up.returncode == 0, up.stderr
        ran = _hybrid("ws", "exec", name, "-e", "FOO=bar", "--", "sh", "-c", 'echo "$FOO"')
        assert ran.returncode == 0 and ran.stdout == "bar\n", ran.stderr
        refused = _hybrid("ws", "exec", name, "-e", "BAR=1", "--", "true")
        assert refused.returncode == 3, refused.stderr
        assert "hybrid ws up NAME --allow-env BAR" in refused.stderr
        assert len(refused.stderr.splitlines()) == 1
        listed = subprocess.run(
            [sys.executable, "-m", "hybrid", "ws", "ls"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "60"},
        )
        assert listed.returncode == 0, listed.stderr
        assert name in listed.stdout, listed.stdout
        assert "…" not in listed.stdout, "nothing is cut to fit the width"
    finally:
        _hybrid("ws", "down", name)
