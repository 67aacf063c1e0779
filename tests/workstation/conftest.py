"""Workstation fixtures on the real engine (``engine`` and ``require_runtime`` live in
tests/conftest.py): every containment test runs once per runtime."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hybrid.policy import Budget, SandboxSpec
from hybrid.tiers.container import container_tiers

RUNTIMES = {t.runtime: t.name for t in container_tiers()}


@pytest.fixture(params=sorted(RUNTIMES), ids=lambda r: r)
def tier(request: pytest.FixtureRequest, require_runtime) -> str:  # type: ignore[no-untyped-def]
    """Each containment test runs once per runtime: runc (tier docker) and runsc (tier gvisor)."""
    tier = RUNTIMES[request.param]
    require_runtime(tier)
    return tier


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
