"""Engine fixtures: a real Docker engine with runc and runsc, or a skip (a failure under
HYBRID_REQUIRE_ENGINE=1, so a green CI run means the container tiers were really tested)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from hybrid.errors import EngineUnavailable
from hybrid.policy import Budget, SandboxSpec

REQUIRE = os.environ.get("HYBRID_REQUIRE_ENGINE") == "1"
RUNTIMES = {"runc": "docker", "runsc": "gvisor"}


def _missing(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"HYBRID_REQUIRE_ENGINE=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def engine():  # type: ignore[no-untyped-def]
    """The Docker backend, once the engine answers and the base image is present."""
    from hybrid.workstation import backend, images
    from hybrid.workstation.docker import client

    try:
        info = client().info()
        if images.get() is None:
            _missing(f"the base image {images.BASE_IMAGE} is missing (run scripts/engine.sh)")
    except EngineUnavailable as exc:
        _missing(str(exc))
        raise  # unreachable: _missing skips or fails
    runtimes = set(info.get("Runtimes") or {})
    made = backend()
    made.runtimes = runtimes  # type: ignore[attr-defined]
    return made


@pytest.fixture(params=sorted(RUNTIMES), ids=lambda r: r)
def tier(request: pytest.FixtureRequest, engine) -> str:  # type: ignore[no-untyped-def]
    """Each containment test runs once per runtime: runc (tier docker) and runsc (tier gvisor)."""
    runtime = request.param
    if runtime not in engine.runtimes:
        _missing(f"the engine has no {runtime} runtime (scripts/engine.sh registers runsc)")
    return RUNTIMES[runtime]


def _spec(tier: str, **budget: object) -> SandboxSpec:
    values: dict[str, object] = {"wall_seconds": 30, "memory": "256M", "pids": 64}
    values.update(budget)
    return SandboxSpec(tier=tier, budget=Budget.model_validate(values))  # type: ignore[arg-type]


@pytest.fixture
def make_spec():  # type: ignore[no-untyped-def]
    """make_spec(tier, **budget): a small hardened spec for tests."""
    return _spec


@pytest.fixture
def ws(engine, tier: str) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """A fresh workstation on ``tier``, removed afterwards."""
    with engine.create(_spec(tier)) as made:
        yield made
