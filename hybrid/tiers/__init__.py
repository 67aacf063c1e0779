"""The execution tiers, cheapest first: the one registry the router, ``admit()``, ``doctor``,
the CLI's tier choices and the hostile suite read.

Adding a tier is one module implementing ``hybrid.tiers.base.Tier`` plus one line in
``REGISTRY``. Importing this package loads no runtime (wasmtime, Docker SDK, pydantic).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hybrid.errors import PolicyError
from hybrid.tiers.base import Probe, Tier, TierLimits
from hybrid.tiers.bwrap import BWRAP
from hybrid.tiers.container import DOCKER, GVISOR
from hybrid.tiers.microvm import MICROVM
from hybrid.tiers.python_wasm import PythonWasmTier
from hybrid.tiers.wasm import WasmTier

REGISTRY: list[Tier] = [
    WasmTier(),
    PythonWasmTier(),
    BWRAP,
    DOCKER,
    GVISOR,
    MICROVM,
]
"""Every tier, in the order the router tries them (cheapest first)."""


def all_tiers() -> tuple[Tier, ...]:
    """The registered tiers, cheapest first."""
    return tuple(REGISTRY)


def names() -> tuple[str, ...]:
    """The registered tier names, cheapest first."""
    return tuple(t.name for t in REGISTRY)


def get(name: str) -> Tier:
    """The tier called ``name``; PolicyError naming the known ones otherwise."""
    for tier in REGISTRY:
        if tier.name == name:
            return tier
    known = names()
    listed = ", ".join(known[:-1]) + f" or {known[-1]}" if len(known) > 1 else "".join(known)
    raise PolicyError(f"unknown tier {name!r} (use {listed})")


@contextlib.contextmanager
def registered(tier: Tier, before: str | None = None) -> Iterator[Tier]:
    """Register ``tier`` (before the tier named ``before``, else last) for the block's duration."""
    if tier.name in names():
        raise PolicyError(f"tier {tier.name!r} is already registered")
    at = names().index(before) if before is not None else len(REGISTRY)
    REGISTRY.insert(at, tier)
    try:
        yield tier
    finally:
        REGISTRY.remove(tier)


__all__ = ["REGISTRY", "Probe", "Tier", "TierLimits", "all_tiers", "get", "names", "registered"]
