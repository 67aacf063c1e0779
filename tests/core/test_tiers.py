"""The tier registry drives the router, admit(), doctor, the CLI's --tier choices and the
hostile suite: a tier registered here (one object, one registry line) appears in all of them
without editing any of them. The fake tier is a test double: the registry is the subject."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybrid import router, tiers, workstation
from hybrid.errors import PolicyError, WorkstationNotFound
from hybrid.policy import Budget, SandboxSpec, admit, tier_limits
from hybrid.results import ExecutionResult, Termination, Usage
from hybrid.tiers.base import OutputCallback, Probe, Tier, TierLimits
from hybrid.tiers.container import container_tiers, runtime_of, tier_of
from hybrid.workstation.local import LocalBackend

EVERYTHING = {name: (True, "test double") for name in tiers.names()}


class FakeTier:
    """Runs only the argv ``["fake-ok", ...]``, echoing it; 1G of memory at most, 1M at least."""

    name = "fake"
    minimums = {"memory": (1024**2, "the fake needs a megabyte")}
    egress_refusal = "network: the fake tier refuses egress"
    streams = False

    def limits(self) -> TierLimits:
        return TierLimits(60, 1024**3, None, 64, 1.0, 64 * 1024**2, True, 1024**3)

    def misfit(self, job: router.Job) -> str | None:
        return None if job.command[:1] == ["fake-ok"] else "the fake runs only fake-ok"

    def reasons(self, job: router.Job) -> list[str]:
        return ["fake-ok is the fake's own command"]

    def probe(self, deep: bool = False) -> Probe:
        return Probe(True, "a fake tier, in process")

    def run(
        self, job: router.Job, spec: SandboxSpec, on_output: OutputCallback | None = None
    ) -> ExecutionResult:
        return ExecutionResult(
            tier=self.name,
            termination=Termination.OK,
            exit_code=0,
            usage=Usage(wall_ms=0.0),
            stdout=" ".join(job.command[1:]) + f" (spec tier {spec.tier})\n",
        )

    def backend(self) -> None:
        return None


@pytest.fixture
def fake() -> Iterator[Tier]:
    with tiers.registered(FakeTier(), before="bwrap") as tier:
        yield tier
    assert "fake" not in tiers.names()


def test_the_registry_is_ordered_cheapest_first_and_every_entry_is_a_tier():
    assert tiers.names() == ("wasm", "python-wasm", "bwrap", "docker", "gvisor", "microvm")
    assert all(isinstance(t, Tier) for t in tiers.all_tiers())
    with pytest.raises(
        PolicyError,
        match=r"unknown tier 'nope' \(use wasm, python-wasm, bwrap, docker, gvisor or microvm\)",
    ):
        tiers.get("nope")


def test_the_runtime_map_is_one_place():
    assert {t.runtime: t.name for t in container_tiers()} == {"runc": "docker", "runsc": "gvisor"}
    assert runtime_of("gvisor") == "runsc" and runtime_of("docker") == runtime_of("auto") == "runc"
    assert tier_of("runsc") == "gvisor" and tier_of("runc") == "docker"


def test_a_registered_tier_is_routed_in_registry_order(fake: Tier):
    available = {**EVERYTHING, "fake": (True, "test double")}
    chosen = router.route(router.Job(command=["fake-ok", "hi"]), available=available)
    assert chosen.tier == "fake"
    assert chosen.reasons == [
        "cheapest tier that honours every trait",
        "fake-ok is the fake's own command",
    ]
    assert set(chosen.rejected) == {"wasm", "python-wasm"}

    passed_over = router.route(router.Job(command=["true"]), available=available)
    assert passed_over.tier == "bwrap"
    assert passed_over.rejected["fake"] == "the fake runs only fake-ok"

    result = router.run(router.Job(command=["fake-ok", "hi"]), "fake", available=available)
    assert result.tier == "fake" and result.stdout == "hi (spec tier fake)\n"


def test_a_registered_tier_sets_admits_limits_and_minimums(fake: Tier):
    assert tier_limits("fake").memory == 1024**3
    assert SandboxSpec(tier="fake").tier == "fake"
    big = SandboxSpec(budget=Budget(memory="2G"))
    assert admit(big, "fake") == ["budget.memory: 2G is above the fake tier's maximum of 1G"]
    assert admit(big, "docker") == []
    small = SandboxSpec(budget=Budget(memory="512k"))
    assert admit(small, "fake") == [
        "budget.memory: 512K is below the fake tier's minimum of 1M (the fake needs a megabyte)"
    ]
    egress = SandboxSpec(network={"mode": "egress", "allow": ["example.com"]})  # type: ignore[arg-type]
    assert admit(egress, "fake") == ["network: the fake tier refuses egress"]
    # auto: the widest maximum of every registered tier still applies
    assert admit(big, "auto") == []


def test_an_unregistered_tier_is_refused_everywhere():
    with pytest.raises(
        PolicyError,
        match="tier: Input should be 'auto', 'wasm', 'python-wasm', 'bwrap', 'docker', 'gvisor' or 'microvm'",
    ):
        SandboxSpec.from_dict({"tier": "fake"})
    with pytest.raises(PolicyError, match="unknown tier 'fake'"):
        admit(SandboxSpec(), "fake")


def test_a_registered_tier_is_in_the_cli(fake: Tier, hybrid_cli, monkeypatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(router, "_probed", {})  # probe again, the fake included
    code, out, _ = hybrid_cli("run", "--help")
    assert code == 0 and "[auto|wasm|python-wasm|fake|bwrap|docker|gvisor|microvm]" in out
    code, out, _ = hybrid_cli("policy", "check", "--help")
    assert code == 0 and "[wasm|python-wasm|fake|bwrap|docker|gvisor|microvm]" in out

    code, out, err = hybrid_cli("route", "--json", "--", "true")
    assert code == 0, err
    assert json.loads(out)["rejected"]["fake"] == "the fake runs only fake-ok"

    code, out, err = hybrid_cli("run", "--", "fake-ok", "from", "the", "cli")
    assert (code, out) == (0, "from the cli (spec tier fake)\n"), err
    assert "running on fake" in err

    spec = tmp_path / "spec.toml"
    spec.write_text('[budget]\nmemory = "2G"\n')
    code, out, _ = hybrid_cli("policy", "check", "--tier", "fake", "--json", str(spec))
    assert code == 3
    assert json.loads(out)["violations"] == [
        "budget.memory: 2G is above the fake tier's maximum of 1G"
    ]

    code, out, _ = hybrid_cli("doctor", "--json")
    assert code == 0
    rows = {row["tier"]: row for row in json.loads(out)}
    assert list(rows)[:4] == ["wasm", "python-wasm", "fake", "bwrap"]
    assert rows["fake"] == {
        "tier": "fake",
        "available": True,
        "detail": "a fake tier, in process",
        "fix": "",
    }


def test_a_registered_tier_is_attacked_by_the_hostile_suite(fake: Tier):
    sys.path.insert(0, str(Path(__file__).parents[1] / "hostile"))
    try:
        from hostile_kit import hostile_tiers
    finally:
        sys.path.pop(0)
    assert hostile_tiers() == [
        "wasm",
        "python-wasm",
        "fake",
        "bwrap",
        "docker",
        "gvisor",
        "microvm",
        "workstation",
    ]


def test_importing_the_registry_loads_no_runtime():
    import subprocess

    code = (
        "import sys, hybrid.tiers, hybrid.cli; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'wasmtime', 'docker'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class FakeWorkstationTier(FakeTier):
    """A tier that keeps workstations: the local backend (host processes) stands behind it."""

    name = "fake-ws"
    minimums = {}

    def backend(self) -> LocalBackend:  # type: ignore[override]
        return LocalBackend()


def test_a_tier_names_its_workstation_backend_and_the_cli_finds_its_workstations(
    hybrid_cli, tmp_path, monkeypatch
):
    monkeypatch.setenv("HYBRID_STATE_DIR", str(tmp_path / "state"))
    assert isinstance(workstation.backend("gvisor"), type(workstation.backend("docker")))
    with pytest.raises(PolicyError, match="tier 'python-wasm' runs in process and keeps no workst"):
        workstation.backend("python-wasm")
    code, _, err = hybrid_cli("ws", "up", "--tier", "wasm")
    assert code == 2 and "runs in process" in err and "Traceback" not in err
    code, _, err = hybrid_cli("ws", "up", "--tier", "docker", "--gvisor")
    assert code == 2 and "--gvisor contradicts --tier docker" in err

    with tiers.registered(FakeWorkstationTier()):
        assert [type(b).__name__ for b in workstation.backends()] == [
            "BwrapBackend",
            "DockerBackend",
            "MicrovmBackend",
            "LocalBackend",
        ]
        code, out, err = hybrid_cli("ws", "up", "w1", "--tier", "fake-ws")
        assert (code, out) == (0, "w1\n"), err
        # Every other command finds it by name, whichever backend holds it.
        assert workstation.locate("w1").tier == "local"
        code, out, _ = hybrid_cli("ws", "exec", "w1", "--", "sh", "-c", "echo hi > f; cat f")
        assert (code, out) == (0, "hi\n")
        code, out, _ = hybrid_cli("ws", "ls", "--json")
        assert "w1" in [w["name"] for w in json.loads(out)["workstations"]]
        code, _, _ = hybrid_cli("ws", "down", "w1")
        assert code == 0
        with pytest.raises(WorkstationNotFound, match="no workstation named w1"):
            workstation.locate("w1")
