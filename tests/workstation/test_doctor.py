"""`hybrid doctor` tells the truth with and without an engine."""

from __future__ import annotations

import json

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
