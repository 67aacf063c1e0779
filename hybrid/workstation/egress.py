"""What the egress proxy logged: one event per request a workstation made, allowed or refused.

The proxy (proxy.py, in its own container) prints each event as one JSON line on stdout; the
engine keeps those lines, capped in size, where nothing inside the workstation can write.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, ValidationError


class EgressEvent(BaseModel):
    """One request through the egress proxy."""

    time: datetime = Field(description="When the proxy decided (UTC).")
    method: str = Field(description="CONNECT, GET, POST, ... ('?' for an unreadable request).")
    host: str = Field(description="The host the request named (cut at 253 characters).")
    port: int
    decision: Literal["allow", "deny", "error"] = Field(
        description="allow: forwarded; deny: refused by policy; error: allowed but unreachable."
    )
    reason: str = Field(description="Why: the rule that refused it, or the connection error.")
    address: str = Field("", description="The address it resolved to and was checked against.")


def parse_events(raw: bytes) -> list[EgressEvent]:
    """The events in the proxy's stdout (lines that are not events are skipped)."""
    events = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            events.append(EgressEvent.model_validate(json.loads(line)))
        except (ValueError, ValidationError):
            continue
    return events
