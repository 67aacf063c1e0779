from __future__ import annotations

from pathlib import Path

import pytest

from hybrid import PolicyError, PolicyViolation, SandboxSpec, admit, enforce
from hybrid.policy import (
    DEFAULT_DISK,
    DEFAULT_WASM_DISK,
    WASM_DISK_MAX,
    Budget,
    Mount,
    parse_size,
    tier_limits,
)


def test_defaults_are_admitted_and_deny_by_default() -> None:
    spec = SandboxSpec()
    assert admit(spec) == []
    assert spec.network.mode == "none"
    assert spec.env.resolve() == {}
    assert spec.mounts == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512", 512),
        ("64k", 65536),
        ("256M", 256 * 1024**2),
        ("1GiB", 1024**3),
        ("1.5G", int(1.5 * 1024**3)),
        (7, 7),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["12Q", "", "-1", "M"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


def test_toml_round_trip(tmp_path: Path) -> None:
    spec = SandboxSpec.model_validate(
        {
            "tier": "docker",
            "budget": {"memory": "512M", "wall_seconds": 5, "pids": 10},
            "mounts": [{"source": str(tmp_path), "target": "/data"}],
            "env": {"allow": ["LANG"], "set": {"LANG": "C.UTF-8"}},
        }
    )
    path = tmp_path / "spec.toml"
    path.write_text(spec.to_toml())
    assert SandboxSpec.from_toml(path) == spec
    assert 'memory = "512M"' in path.read_text()


def test_every_violation_is_reported(tmp_path: Path) -> None:
    home_ssh = Path("~/.ssh").expanduser()
    spec = SandboxSpec.model_validate(
        {
            "tier": "docker",
            "network": {"mode": "egress"},
            "mounts": [
                {"source": str(home_ssh), "target": "/keys"},
                {"source": "/var/run/docker.sock", "target": "/sock"},
                {"source": "/etc/shadow", "target": "/shadow"},
                {"source": str(Path("~/.aws").expanduser()), "target": "/aws"},
                {"source": str(tmp_path), "target": "/out", "mode": "rw"},
                {"source": "/", "target": "/host"},
            ],
            "env": {
                "set": {"FOO": "1"},
                "inherit": ["AWS_SECRET_ACCESS_KEY"],
                "allow": ["AWS_SECRET_ACCESS_KEY"],
            },
            "budget": {"pids": 10**6, "memory": "100T"},
        }
    )
    violations = admit(spec)
    text = "\n".join(violations)
    assert "egress without an allow-list" in text
    assert ".ssh" in text and "docker.sock" in text and "/etc/shadow" in text and ".aws" in text
    assert "writable mount outside the workspace" in text
    assert "mounts[5] / -> /host" in text  # a mount that contains a secret path
    assert "FOO is not on the allow-list" in text
    assert "AWS_SECRET_ACCESS_KEY looks like a credential" in text
    assert "budget.pids" in text and "budget.memory" in text
    assert len(violations) == 11
    with pytest.raises(PolicyViolation) as info:
        enforce(spec)
    assert info.value.violations == violations
    assert info.value.exit_code == 3


def test_tier_maximum_and_network_per_tier() -> None:
    spec = SandboxSpec(
        budget=Budget(memory="8G"), network={"mode": "egress", "allow": ["pypi.internal:443"]}
    )
    assert admit(spec, "docker") == []
    wasm = admit(spec, "wasm")
    assert any("budget.memory: 8G is above the wasm tier's maximum of 4G" in v for v in wasm)
    assert any("wasm tier has no network" in v for v in wasm)


def test_writable_mount_inside_workspace_is_fine(tmp_path: Path) -> None:
    spec = SandboxSpec(mounts=[Mount(source=tmp_path, target="/workspace/out", mode="rw")])
    assert admit(spec) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[budget", "not valid TOML"),
        ("budget = 3", "budget: Input should be a valid dictionary"),
        ("[budget]\nmemroy = '1G'", "budget.memroy: Extra inputs are not permitted"),
        ("[budget]\nmemory = 'lots'", "budget.memory"),
        ("[[mounts]]\nsource = '/x'\ntarget = 'rel'", "mounts.0.target"),
        ("tier = 'mainframe'", "tier"),
    ],
)
def test_malformed_policy_names_the_field(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(content)
    with pytest.raises(PolicyError) as info:
        SandboxSpec.from_toml(path)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="no such policy file"):
        SandboxSpec.from_toml(tmp_path / "absent.toml")


def test_disk_defaults_per_tier() -> None:
    budget = Budget()
    assert budget.disk is None
    assert DEFAULT_DISK == 2 * 1024**3 and DEFAULT_WASM_DISK == 64 * 1024**2
    for tier in ("docker", "gvisor"):
        assert budget.disk_for(tier) == DEFAULT_DISK
    for tier in ("wasm", "python-wasm"):
        assert budget.disk_for(tier) == DEFAULT_WASM_DISK
    assert Budget(disk="100M").disk_for("docker") == 100 * 1024**2
    assert Budget(disk="100M").disk_for("wasm") == 100 * 1024**2
    for bad in (0, -1, "lots"):
        with pytest.raises(ValueError):
            Budget(disk=bad)


def test_disk_round_trips_through_toml(tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    sized = SandboxSpec(budget=Budget(disk="3G"))
    path.write_text(sized.to_toml())
    assert 'disk = "3G"' in path.read_text()
    assert SandboxSpec.from_toml(path) == sized
    default = SandboxSpec()
    path.write_text(default.to_toml())  # unset: no key at all (TOML has no null)
    assert "disk" not in path.read_text()
    assert SandboxSpec.from_toml(path).budget.disk is None


def test_disk_maximum_per_tier() -> None:
    assert tier_limits("wasm").disk == tier_limits("python-wasm").disk == WASM_DISK_MAX
    host = tier_limits("docker").disk
    assert host == tier_limits("gvisor").disk and host > DEFAULT_DISK
    big = SandboxSpec(budget=Budget(disk="2G"))
    assert admit(big, "docker") == [] and admit(big, "gvisor") == []
    assert admit(big, "wasm") == ["budget.disk: 2G is above the wasm tier's maximum of 1G"]
    assert admit(big, "python-wasm")
    huge = SandboxSpec(budget=Budget(disk=host + 1))
    assert any("budget.disk" in v and "docker tier's maximum" in v for v in admit(huge, "docker"))
    assert admit(SandboxSpec(), "wasm") == [] and admit(SandboxSpec(), "docker") == []
