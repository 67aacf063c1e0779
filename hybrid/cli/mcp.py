"""``hybrid mcp``: serve the toolkit's tools over the Model Context Protocol (stdio or HTTP)."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import click

from hybrid.cli._output import json_option
from hybrid.cli.agent import _model_from, _with, model_options
from hybrid.errors import EngineUnavailable, InvalidInput
from hybrid.policy import SandboxSpec

_MODEL_KEYS = ("model_name", "model_config", "replay", "answers")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command("mcp")
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio (the client starts this process) or streamable HTTP.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP: loopback address.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--root",
    "roots",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Repository root the path tools may read (repeatable; default the current directory).",
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(path_type=Path),
    help="SandboxSpec TOML every call obeys (default: each tier's own default).",
)
@click.option(
    "--idle",
    type=float,
    default=1800.0,
    show_default=True,
    help="Seconds a workstation (and an HTTP session) may sit unused before it is removed.",
)
@_with(model_options)
@json_option  # HTTP: where it listens, as one JSON line first (stdio: stdout is the protocol)
def mcp_cmd(
    transport: str,
    host: str,
    port: int,
    roots: tuple[Path, ...],
    policy_file: Path | None,
    idle: float,
    as_json: bool,
    **model: Any,
) -> None:
    """Serve repo_map, run_python, ws_* and the other tools to an MCP client.

    Workstations a session creates are removed when it ends. Every call obeys --policy;
    path arguments must lie inside a --root.
    """
    from hybrid.mcp import open_toolbox

    if transport == "http" and not _loopback(host):
        raise InvalidInput(
            f"--host {host}: the HTTP transport has no authentication; bind it to a loopback address"
        )
    spec = SandboxSpec.from_toml(policy_file) if policy_file else None
    chosen = any(model[k] for k in _MODEL_KEYS)
    toolbox = open_toolbox(
        list(roots) or [Path.cwd()],
        spec,
        model=_model_from(model) if chosen else None,
        idle_seconds=idle,
    )
    try:
        from hybrid.mcp.server import serve
    except ImportError as exc:
        raise EngineUnavailable(
            f"the MCP server needs the mcp package ({exc.name} is missing): "
            "pip install 'hybrid[mcp]'"
        ) from None
    if transport == "http":
        where = f"[{host}]" if ":" in host else host
        url = f"http://{where}:{port}/mcp"
        if as_json:
            click.echo(json.dumps({"transport": "http", "url": url}))
        else:
            click.echo(f"hybrid: MCP over HTTP at {url}", err=True)
    serve(toolbox, "http" if transport == "http" else "stdio", host=host, port=port)
