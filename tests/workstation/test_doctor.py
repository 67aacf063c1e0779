"""`hybrid doctor` tells the truth with and without an engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hybrid.cli import cli
from hybrid.workstation.doctor import probe


def test_without_docker_the_container_tiers_say_why_and_how(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    rows = {s.tier: s for s in probe()}
    assert rows["wasm"].available
    for tier in ("docker", "gvisor"):
        assert not rows[tier].available
        assert "no Docker engine" in rows[tier].detail
        assert "hybrid engine install" in rows[tier].fix
    result = CliRunner().invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 0
    assert {r["tier"]: r["available"] for r in json.loads(result.stdout)}["docker"] is False


@pytest.mark.engine
def test_with_the_engine_both_runtimes_really_run(engine):
    rows = {s.tier: s for s in probe(deep=True)}
    assert rows["docker"].available, rows["docker"]
    if "runsc" in engine.runtimes:
        assert rows["gvisor"].available, rows["gvisor"]
        assert "a hardened container ran" in rows["gvisor"].detail


@pytest.fixture
def fresh_profile():  # type: ignore[no-untyped-def]
    """The docker seccomp profile is read once per process: read it again around the test."""
    from hybrid.workstation.docker import seccomp

    seccomp._loaded.cache_clear()
    yield seccomp
    seccomp._loaded.cache_clear()


@pytest.mark.engine
def test_doctor_names_the_docker_seccomp_profile_in_force(engine, fresh_profile):
    rows = {s.tier: s for s in probe()}
    assert "seccomp: the engine's default profile" in rows["docker"].detail, rows["docker"]
    assert "AF_VSOCK" in rows["docker"].detail
    if "runsc" in engine.runtimes:
        assert "runsc ignores it" in rows["gvisor"].detail, rows["gvisor"]
    profile = json.loads(fresh_profile.profile())
    assert all(not arch["subArchitectures"] for arch in profile["archMap"])
    assert not any(
        rule["action"] == "SCMP_ACT_ALLOW" and "socket" in rule["names"] and not rule.get("args")
        for rule in profile["syscalls"]
    )


@pytest.mark.engine
def test_a_missing_seccomp_profile_refuses_docker_jobs(
    engine, fresh_profile, monkeypatch, tmp_path
):
    monkeypatch.setenv("HYBRID_DOCKER_SECCOMP", str(tmp_path / "absent.json"))
    rows = {s.tier: s for s in probe()}
    assert not rows["docker"].available
    assert fresh_profile.PACKAGE in rows["docker"].detail
    # The CLI: one line naming the package, no container made, no traceback.
    run = subprocess.run(
        [sys.executable, "-m", "hybrid", "run", "--tier", "docker", "--", "true"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert run.returncode != 0
    assert fresh_profile.PACKAGE in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


@pytest.mark.parametrize("helper_uid", ["1", "job"])
def test_helper_ids_held_by_a_host_account_refuse_every_process_tier(helper_uid):
    """The egress proxy's and namespace holders' ids are checked like the jobs' (jobuser): a host
    account's uid (here daemon's, 1) or the jobs' own stops every process tier before it runs."""
    from hybrid.workstation import jobuser

    uid = str(jobuser.JOB_UID) if helper_uid == "job" else helper_uid
    probe_ids = (
        "from hybrid.errors import EngineUnavailable\n"
        "from hybrid.workstation import jobuser\n"
        "try:\n    jobuser.check()\nexcept EngineUnavailable as exc:\n    print(exc)\n"
        "print(jobuser.describe())\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe_ids],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "HYBRID_HELPER_UID": uid,
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        },
    )
    refused, described = run.stdout.strip().splitlines()
    assert "their helpers as uid" in refused and "HYBRID_HELPER_UID" in refused, refused
    assert "REFUSED" in described, described
    if helper_uid == "1":
        assert "host user 'daemon' has uid 1" in refused, refused
