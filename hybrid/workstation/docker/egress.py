"""The egress relay and proxy containers' settings, and their request log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from docker import errors

from hybrid.errors import WorkstationError
from hybrid.workstation import jobuser
from hybrid.workstation.docker.engine import client, translate
from hybrid.workstation.egress import parse_events

if TYPE_CHECKING:
    import builtins

    from hybrid.workstation.egress import EgressEvent


# The egress relay and proxy run as ids no host account has (not nobody's: a host process running
# as nobody could read the proxy's environment and trace it); its request log is capped at 2 x this.
_EGRESS_USER = jobuser.HELPER_USER
_EGRESS_LOG_SIZE = "1m"


def egress_log(name: str) -> builtins.list[EgressEvent]:
    """Every request workstation ``name``'s proxy saw, oldest first (as far as the log reaches)."""
    with translate(f"egress log of {name}"):
        try:
            raw = client().api.logs(f"hybrid-{name}-proxy", stdout=True, stderr=False)
        except errors.NotFound:
            raise WorkstationError(
                f"{name}: its egress proxy is gone (remove and recreate it)"
            ) from None
    return parse_events(raw)
