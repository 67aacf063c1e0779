"""Router decisions (host availability is a test double: the engine is not the subject here),
and the cheap tiers really run through hybrid.router.run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hybrid.errors import EngineUnavailable, PolicyViolation
from hybrid.policy import Budget, NetworkPolicy, SandboxSpec
from hybrid.results import Termination
from hybrid.router import Job, route, run

EVERYTHING = {tier: (True, "test double") for tier in ("wasm", "python-wasm", "docker", "gvisor")}
NO_ENGINE = {**EVERYTHING, "docker": (False, "no engine"), "gvisor": (False, "no engine")}
DATA = Path(__file__).parents[1] / "data"


def test_checks_and_modules_go_to_wasm():
    assert (
        route(Job(check="csv", check_args={"data": "a,b\n1,2\n"}), available=EVERYTHING).tier
        == "wasm"
    )
    assert route(Job(command=["tool.wasm", "--flag"]), available=EVERYTHING).tier == "wasm"


def test_snippets_go_to_python_wasm_unless_they_need_more():
    assert route(Job(python="print(1)"), available=EVERYTHING).tier == "python-wasm"
    assert (
        route(Job(command=["python3", "-c", "print(1)"]), available=EVERYTHING).tier
        == "python-wasm"
    )
    chosen = route(Job(python="import subprocess", needs_processes=True), available=EVERYTHING)
    assert chosen.tier == "docker"
    assert "processes" in chosen.rejected["python-wasm"]
    assert route(Job(python="print(1)", toolchain="node"), available=EVERYTHING).tier == "docker"


def test_commands_repos_and_untrusted_code():
    assert route(Job(command=["make", "test"]), available=EVERYTHING).tier == "docker"
    repo = route(Job(command=["pytest", "-q"], repo=Path(".")), available=EVERYTHING)
    assert repo.tier == "docker" and "repository-wide files" in " ".join(repo.reasons)
    hostile = route(Job(command=["./unknown-binary"], untrusted=True), available=EVERYTHING)
    assert hostile.tier == "gvisor"
    assert "gVisor" in hostile.rejected["docker"]


def test_budgets_beyond_a_tier_move_the_job():
    big = SandboxSpec(budget=Budget(memory="8G"))
    chosen = route(Job(python="print(1)", spec=big), available=EVERYTHING)
    assert chosen.tier == "docker"
    assert "memory" in chosen.rejected["python-wasm"]
    assert route(Job(python="x", input_bytes=512 * 1024**2), available=EVERYTHING).tier == "docker"


def test_unavailable_tiers_are_explained():
    chosen = route(Job(python="print(1)"), available=NO_ENGINE)
    assert chosen.tier == "python-wasm"
    with pytest.raises(EngineUnavailable) as missing:  # a missing engine, not a policy refusal
        route(Job(command=["make"]), available=NO_ENGINE)
    assert "no engine" in str(missing.value) and missing.value.exit_code == 5
    with pytest.raises(EngineUnavailable):
        route(Job(command=["make"]), tier="gvisor", available=NO_ENGINE)
    with pytest.raises(PolicyViolation) as refused:
        route(Job(command=["curl", "example.org"], needs_network=True), available=EVERYTHING)
    assert "allow-list" in str(refused.value)


def test_network_jobs_need_an_allow_list_and_runc():
    egress = SandboxSpec(network=NetworkPolicy(mode="egress", allow=["index.example.com:443"]))
    chosen = route(Job(command=["pip", "download", "six"], spec=egress), available=EVERYTHING)
    assert chosen.tier == "docker"
    assert "egress to index.example.com:443" in " ".join(chosen.reasons)
    assert "network" in chosen.rejected["python-wasm"] or "network" in chosen.rejected["wasm"]
    with pytest.raises(PolicyViolation) as refused:
        route(Job(command=["./x"], spec=egress, untrusted=True), available=EVERYTHING)
    assert "gVisor" in str(refused.value)


def test_explicit_tier_must_honour_the_job():
    with pytest.raises(PolicyViolation) as refused:
        route(Job(command=["make"]), tier="wasm", available=EVERYTHING)
    assert "wasm" in str(refused.value)
    assert (
        route(Job(command=["make"]), tier="gvisor", available=EVERYTHING).reasons[0]
        == "requested explicitly"
    )


def test_jobs_reject_unknown_traits():
    with pytest.raises(ValueError):
        Job.model_validate({"command": ["x"], "needs_gpu": True})


def test_run_a_check_on_the_wasm_tier():
    ok = run(Job(check="csv", check_args={"data": "a,b\n1,2\n", "require": ["a"]}))
    assert ok.tier == "wasm" and ok.termination is Termination.OK, ok
    assert json.loads(ok.stdout)["ok"] is True
    bad = run(Job(check="csv", check_args={"data": "a,b\n1,2\n", "require": ["zzz"]}))
    assert not bad.ok and bad.exit_code == 1


def test_run_a_wasi_module_on_the_wasm_tier():
    result = run(Job(command=[str(DATA / "hello.wat")]))
    assert result.tier == "wasm" and result.ok, result
    assert result.stdout


def test_run_with_the_engine_down_exits_5(tmp_path):
    """No tier that can run a command is reachable (no engine, no bwrap on PATH): exit 5, one line.
    The same for `--tier docker` alone, while bwrap, which needs no engine, still runs it."""
    import os
    import subprocess
    import sys

    no_bwrap = tmp_path / "bin"
    no_bwrap.mkdir()
    for tool in ("sh", "setpriv", "git"):
        found = shutil.which(tool)
        if found:
            (no_bwrap / tool).symlink_to(found)
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"}

    def run(*argv: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hybrid", "run", *argv],
            capture_output=True,
            text=True,
            env={**env, "PATH": path} if path else env,
            timeout=120,
        )

    done = run("--", "make", "test", path=str(no_bwrap))
    assert done.returncode == 5, done.stderr
    assert done.stderr.startswith("hybrid: error: no tier that can run this job is available")
    assert len(done.stderr.splitlines()) == 1 and "no-such.sock" in done.stderr
    done = run("--tier", "docker", "--", "true")
    assert done.returncode == 5, done.stderr
    assert len(done.stderr.splitlines()) == 1 and "no-such.sock" in done.stderr
    if shutil.which("bwrap"):
        assert run("--tier", "bwrap", "--", "true").returncode == 0
