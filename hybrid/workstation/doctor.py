"""Which execution tiers this host can run, and for each one it cannot, why and how to enable it.

Every registered tier (``hybrid.tiers``) probes the real thing (import the runtime, ping the
engine, list its runtimes, look up the base image; ``deep`` also starts a container per
runtime) and never raises: a missing piece is a row with ``available=False``, a reason and a fix.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from hybrid import tiers
from hybrid.tiers.base import probe_session
from hybrid.tiers.container import ENGINE_SETUP as ENGINE_SETUP  # re-exported


class TierStatus(BaseModel):
    """One tier on this host."""

    tier: str
    available: bool
    detail: str = Field(
        description="What was found (versions, images), or why the tier cannot run."
    )
    fix: str = Field("", description="How to enable it, when it is not available.")


def probe(deep: bool = False) -> list[TierStatus]:
    """Probe every registered tier, cheapest first (one engine ping shared by the container tiers)."""
    with probe_session():
        rows = []
        for tier in tiers.all_tiers():
            found = tier.probe(deep)
            rows.append(
                TierStatus(
                    tier=tier.name,
                    available=found.available,
                    detail=found.detail,
                    fix="" if found.available else found.fix,
                )
            )
        return rows
