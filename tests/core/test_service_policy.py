"""[[services]] in the policy: loading, round trip, and admit()'s refusals (no engine needed)."""

from __future__ import annotations

import pytest

from hybrid.errors import PolicyError
from hybrid.policy import NetworkPolicy, SandboxSpec, Service, admit
from hybrid.workstation.services import environment

TOML = """
tier = "docker"

[[services]]
kind = "postgres"
version = "15"
env = { POSTGRES_USER = "app", POSTGRES_PASSWORD = "pw", POSTGRES_DB = "appdb" }

[[services]]
kind = "redis"
name = "cache"
port = 6380
memory = "64M"
"""


def test_services_load_round_trip_and_give_variables(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(TOML)
    spec = SandboxSpec.from_toml(path)
    assert [s.key for s in spec.services] == ["postgres", "cache"]
    assert spec.services[1].memory == 64 * 1024**2
    again = tmp_path / "again.toml"
    again.write_text(spec.to_toml())
    assert SandboxSpec.from_toml(again) == spec
    assert "services" not in SandboxSpec(tier="docker").to_toml()
    assert admit(spec) == []
    env = environment(spec.services)
    assert env["DATABASE_URL"] == "postgresql://app:pw@127.0.0.1:5432/appdb"
    assert (env["PGUSER"], env["PGPASSWORD"], env["PGDATABASE"]) == ("app", "pw", "appdb")
    assert env["REDIS_URL"] == env["CACHE_URL"] == "redis://127.0.0.1:6380/0"


def test_unknown_service_fields_and_kinds_are_refused(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('[[services]]\nkind = "mysql"\n')
    with pytest.raises(PolicyError, match=r"services\.0\.kind"):
        SandboxSpec.from_toml(path)
    path.write_text('[[services]]\nkind = "redis"\nbogus = 1\n')
    with pytest.raises(PolicyError, match="bogus"):
        SandboxSpec.from_toml(path)


@pytest.mark.parametrize(
    ("services", "network", "expected"),
    [
        ([Service(kind="redis"), Service(kind="redis")], None, "two services are named redis"),
        (
            [Service(kind="redis"), Service(kind="postgres", name="db", port=6379)],
            None,
            "port 6379 is taken by redis",
        ),
        ([Service(kind="redis", port=3128)], "egress", "port 3128 is taken by the egress proxy"),
        ([Service(kind="image")], None, "kind image needs image"),
        ([Service(kind="redis", name="Bad_Name")], None, "name must be"),
        (
            [Service(kind="postgres", env={"POSTGRES_USER": "x'; DROP"})],
            None,
            "plain SQL identifier",
        ),
        ([Service(kind="image", image="i:1", data="rel")], None, "absolute path"),
    ],
)
def test_admit_lists_service_problems(services, network, expected):
    net = NetworkPolicy(mode="egress", allow=["example.org"]) if network else NetworkPolicy()
    spec = SandboxSpec(tier="docker", services=services, network=net)
    problems = admit(spec)
    assert any(expected in p for p in problems), problems


def test_tiers_without_services_refuse_them():
    for tier, words in (("gvisor", "gVisor"), ("wasm", "runs no services")):
        problems = admit(SandboxSpec(tier=tier, services=[Service(kind="redis")]))
        assert any(words in p for p in problems), (tier, problems)
