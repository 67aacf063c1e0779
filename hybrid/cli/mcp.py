"""``hybrid mcp``: serve the toolkit's tools over the Model Context Protocol (stdio or HTTP)."""

from __future__ import annotations

import ipaddress
import json
import socket
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
    "--unix-socket",
    type=click.Path(path_type=Path),
    help="HTTP: listen on this Unix socket instead of TCP (mode 0600; only this user may connect, "
    "no token).",
)
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
    unix_socket: Path | None,
    roots: tuple[Path, ...],
    policy_file: Path | None,
    idle: float,
    as_json: bool,
    **model: Any,
) -> None:
    """Serve repo_map, run_python, ws_* and the other tools to an MCP client.

    Workstations a session creates are removed when it ends. Every call obeys --policy;
    path arguments must lie inside a --root.

    Over HTTP on TCP every request must carry the header `Authorization: Bearer <token>`, the
    token being the content of the file this command prints at start (mcp.token, mode 0600, in
    the runtime directory: HYBRID_RUNTIME_DIR, else XDG_RUNTIME_DIR/hybrid, else the state
    directory's run/); it is kept across restarts. A request without it gets 401. With
    --unix-socket no token is needed: only this user can connect.
    """
    from hybrid.mcp import open_toolbox

    if transport == "http" and unix_socket is None and not _loopback(host):
        raise InvalidInput(
            f"--host {host}: the HTTP transport is plain HTTP (its token would cross the network "
            "in clear); bind it to a loopback address"
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
    if transport != "http":
        serve(toolbox, "stdio")
        return
    from hybrid import tokens
    from hybrid.mcp import auth

    try:
        if unix_socket is not None:
            listener = auth.unix_listener(unix_socket)
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            listener = socket.create_server((host.strip("[]"), port), family=family)
    except OSError as exc:
        where = unix_socket or f"{host}:{port}"
        raise InvalidInput(f"cannot listen on {where}: {exc.strerror or exc}") from None
    token_file = None if unix_socket is not None else auth.token_path()
    token = tokens.kept(token_file) if token_file is not None else None
    if unix_socket is not None:
        url = "http://localhost/mcp"
        shown = {"transport": "http", "url": url, "unix_socket": str(unix_socket)}
        said = f"hybrid: MCP over HTTP on the Unix socket {unix_socket} (this user only), {url}"
    else:
        bound = listener.getsockname()[1]
        where = f"[{host}]" if ":" in host else host
        url = f"http://{where}:{bound}/mcp"
        shown = {
            "transport": "http",
            "url": url,
            "token_file": str(token_file),
            "header": auth.HEADER,
        }
        said = (
            f"hybrid: MCP over HTTP at {url}; send '{auth.HEADER}: Bearer <token>' "
            f"with the token in {token_file}"
        )
    if as_json:
        click.echo(json.dumps(shown))
    else:
        click.echo(said, err=True)
    serve(toolbox, "http", host=host, listener=listener, token=token)
