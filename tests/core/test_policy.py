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


# Failure 7 of issue 9: specs admit() used to let through.


@pytest.mark.parametrize("pattern", ["*", "*:*", "*.*", "?*", "*:443", "*.com", "pypi.*", "[a-z]*"])
def test_allow_lists_that_match_every_host_are_refused(pattern: str) -> None:
    spec = SandboxSpec(tier="docker", network={"mode": "egress", "allow": [pattern]})
    violations = admit(spec)
    assert len(violations) == 1, violations
    assert f"network.allow[0] {pattern!r}: matches hosts in every domain" in violations[0]


@pytest.mark.parametrize("pattern", ["index.example.com", "example.com:443", "*.example.com:*"])
def test_allow_lists_that_name_hosts_are_admitted(pattern: str) -> None:
    assert admit(SandboxSpec(tier="docker", network={"mode": "egress", "allow": [pattern]})) == []


def _mounted(source: str | Path, mode: str = "ro") -> list[str]:
    spec = SandboxSpec(mounts=[Mount(source=Path(source), target="/workspace/m", mode=mode)])
    return admit(spec)


@pytest.mark.parametrize(
    "source",
    ["/run/docker", "/run/containerd", "/var/lib/docker", "/etc/ssh", "~/.m2", "~/.cache/hybrid"],
)
def test_mounts_of_engine_and_host_control_paths_are_refused(source: str) -> None:
    violations = _mounted(source)
    assert len(violations) == 1 and "exposes the host secret path" in violations[0], violations


def test_the_module_cache_and_state_dir_are_secret(tmp_path: Path, monkeypatch) -> None:
    from hybrid.paths import cache_dir, state_dir

    monkeypatch.setenv("HYBRID_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HYBRID_STATE_DIR", str(tmp_path / "state"))
    for directory in (cache_dir("wasm"), state_dir("baselines")):
        assert any("exposes the host secret path" in v for v in _mounted(directory))
    link = tmp_path / "innocent"
    link.symlink_to(tmp_path / "cache")  # symlinks are resolved
    assert any("exposes the host secret path" in v for v in _mounted(link))
    assert _mounted(tmp_path / "elsewhere") == []


@pytest.mark.parametrize(
    "source", ["/etc", "/usr", "/bin", "/lib", "/var", "/boot", "/proc", "/sys", "/", "/usr/lib"]
)
def test_writable_mounts_of_system_directories_are_refused(source: str) -> None:
    assert any("writable mount of the host system directory" in v for v in _mounted(source, "rw"))
    assert not any("system directory" in v for v in _mounted(source, "ro"))


@pytest.mark.parametrize("name", ["OPENAI_APIKEY", "DATABASE_URL", "GH_PAT", "NPM_AUTH"])
def test_credential_names_are_never_inherited(name: str) -> None:
    spec = SandboxSpec(env={"allow": [name], "inherit": [name]})
    assert admit(spec) == [
        f"env: {name} looks like a credential; host credentials are never inherited (set a scoped value in env.set)"
    ]


def test_urls_carrying_a_password_are_credentials(monkeypatch) -> None:
    monkeypatch.setenv("SERVICE_URL", "https://bot:hunter2@git.example.com/x.git")
    monkeypatch.setenv("MIRROR_URL", "https://mirror.example.com/debian")
    names = ["SERVICE_URL", "MIRROR_URL", "LANG", "PATH", "GIT_AUTHOR_NAME"]
    violations = admit(SandboxSpec(env={"allow": names, "inherit": names}))
    assert len(violations) == 1 and "SERVICE_URL looks like a credential" in violations[0]


@pytest.mark.parametrize(
    ("budget", "field"),
    [("fuel = true", "fuel"), ("pids = false", "pids"), ("wall_seconds = true", "wall_seconds")],
)
def test_booleans_are_not_budgets(tmp_path: Path, budget: str, field: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f"[budget]\n{budget}\n")
    with pytest.raises(PolicyError, match=f"budget.{field}: must be a number, not "):
        SandboxSpec.from_toml(path)


@pytest.mark.parametrize(
    ("tier", "budget", "message"),
    [
        ("auto", {"memory": "1"}, "budget.memory: 1 is below the auto tier's minimum of 64K"),
        ("docker", {"memory": "4M"}, "budget.memory: 4M is below the docker tier's minimum of 6M"),
        ("gvisor", {"memory": "8M"}, "budget.memory: 8M is below the gvisor tier's minimum of 16M"),
        ("gvisor", {"pids": 8}, "budget.pids: 8 is below the gvisor tier's minimum of 32"),
        ("docker", {"pids": 1}, "budget.pids: 1 is below the docker tier's minimum of 2"),
        (
            "docker",
            {"cpus": 0.001},
            "budget.cpus: 0.001 is below the docker tier's minimum of 0.01",
        ),
        ("wasm", {"wall_seconds": 0.001}, "budget.wall_seconds: 0.001 is below"),
        ("wasm", {"output_bytes": 1}, "budget.output_bytes: 1 is below the wasm tier's minimum"),
    ],
)
def test_caps_too_small_to_start_anything_are_refused(
    tier: str, budget: dict, message: str
) -> None:
    violations = admit(SandboxSpec(tier=tier, budget=budget))
    assert len(violations) == 1 and violations[0].startswith(message), violations


@pytest.mark.parametrize(
    ("workspace", "message"),
    [
        ("/proc", "the system directory /proc"),
        ("/workspace/../etc", "must not contain '..'"),
        ("/usr/src", "the system directory /usr"),
        ("//etc", "the system directory /etc"),
        ("workspace", "absolute directory"),
    ],
)
def test_workspaces_on_system_paths_are_refused(workspace: str, message: str) -> None:
    violations = admit(SandboxSpec(workspace=workspace))
    assert len(violations) == 1 and message in violations[0], violations


def test_gvisor_with_egress_is_refused_by_admit() -> None:
    spec = SandboxSpec(tier="gvisor", network={"mode": "egress", "allow": ["example.com"]})
    (violation,) = admit(spec)
    assert "gVisor here runs with --network=none" in violation
    assert admit(spec, "docker") == []


def test_every_new_violation_is_listed_at_once(monkeypatch) -> None:
    spec = SandboxSpec.model_validate(
        {
            "tier": "gvisor",
            "network": {"mode": "egress", "allow": ["*"]},
            "mounts": [
                {"source": "/var/lib/docker", "target": "/d"},
                {"source": "/usr", "target": "/workspace/usr", "mode": "rw"},
            ],
            "workspace": "/proc",
            "env": {"allow": ["GH_PAT"], "inherit": ["GH_PAT"]},
            "budget": {"memory": "1"},
        }
    )
    text = "\n".join(admit(spec))
    for expected in (
        "gVisor here runs with --network=none",
        "network.allow[0] '*'",
        "mounts[0] /var/lib/docker -> /d: exposes",
        "mounts[1] /usr -> /workspace/usr: writable mount outside the workspace /proc",
        "mounts[1] /usr -> /workspace/usr: writable mount of the host system directory /usr",
        "workspace: '/proc'",
        "env: GH_PAT looks like a credential",
        "budget.memory: 1 is below",
    ):
        assert expected in text, text


def test_policy_check_and_run_agree_on_gvisor_with_egress(hybrid_cli, tmp_path: Path) -> None:
    """The rule lives in admit(): `policy check` says it, and `run`/`route` refuse before any engine."""
    spec = tmp_path / "gvisor-egress.toml"
    spec.write_text('tier = "gvisor"\n[network]\nmode = "egress"\nallow = ["example.com"]\n')
    code, out, _ = hybrid_cli("policy", "check", str(spec))
    assert code == 3 and "gVisor here runs with --network=none" in out
    for command in ("run", "route"):
        code, out, err = hybrid_cli(
            command, "--tier", "gvisor", "--policy", str(spec), "--", "true"
        )
        assert code == 3, (out, err)
        assert len(err.strip().splitlines()) == 1
        assert "gVisor here runs with --network=none" in err


@pytest.mark.parametrize("pattern", ["[::1]:8080", "[fc00::1]", "[::ffff:10.1.2.3]:*"])
def test_ipv6_literal_patterns_are_read_as_the_proxy_reads_them(pattern: str) -> None:
    spec = SandboxSpec(tier="docker", network={"mode": "egress", "allow": [pattern]})
    assert admit(spec) == []


@pytest.mark.parametrize("pattern", ["[::1", "[::1]8080", "[:]:80x"])
def test_malformed_ipv6_patterns_are_refused(pattern: str) -> None:
    spec = SandboxSpec(tier="docker", network={"mode": "egress", "allow": [pattern]})
    assert len(admit(spec)) == 1
