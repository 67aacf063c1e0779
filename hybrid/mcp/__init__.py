"""``hybrid mcp``: the toolkit's tools for agents that speak the Model Context Protocol.

The server (server.py, on the official ``mcp`` SDK, the optional ``mcp`` extra) exposes
repo_map, context_pack, skeleton, run_check, run_python, ws_create, ws_exec, ws_read_file,
ws_write_file, ws_diff, ws_snapshot, ws_destroy, gate_patch and solve. What each tool does is
plain library code (tools.py); scope.py holds the roots and the policy every call obeys;
sessions.py ties the workstations a session makes to that session.

    from hybrid.mcp import open_toolbox
    from hybrid.mcp.server import serve
    serve(open_toolbox([Path(".")]), "stdio")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybrid.mcp.scope import Scope
from hybrid.mcp.sessions import Workstations
from hybrid.mcp.tools import Toolbox
from hybrid.policy import SandboxSpec

DEFAULT_IDLE = 1800.0
"""Seconds a workstation (and an HTTP session) may sit unused before it is removed."""


def open_toolbox(
    roots: list[Path],
    spec: SandboxSpec | None = None,
    *,
    model: Any = None,
    idle_seconds: float = DEFAULT_IDLE,
    backend: Any = None,
) -> Toolbox:
    """The tools over ``roots`` under ``spec`` (each tier's default when None), with ``model`` for solve."""
    from hybrid.errors import InvalidInput

    if not idle_seconds > 0:
        raise InvalidInput(f"idle time {idle_seconds}: give a positive number of seconds")
    if backend is None:
        from hybrid.workstation import backend as default_backend

        backend = default_backend()
    return Toolbox(Scope(roots, spec), Workstations(backend, idle_seconds), model)


__all__ = ["DEFAULT_IDLE", "Scope", "Toolbox", "Workstations", "open_toolbox"]
