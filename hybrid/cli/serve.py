"""``hybrid serve``: the resident server that keeps the toolkit warm behind the command line."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import click

from hybrid.cli._output import emit, json_option
from hybrid.errors import HybridError


@click.command("serve")
@click.option(
    "--idle",
    "idle_seconds",
    type=float,
    default=600.0,
    show_default=True,
    envvar="HYBRID_SERVE_IDLE",
    help="Exit after this many seconds without a command.",
)
@click.option("--workers", type=int, help="Warm worker processes at start (default: the cores).")
@click.option("--max-workers", type=int, help="The most workers while all are busy.")
@click.option(
    "--pool-size",
    type=int,
    default=1,
    show_default=True,
    envvar="HYBRID_POOL_SIZE",
    help="Ready sandboxes per (tier, image, spec) that jobs use; 0 turns the pool off.",
)
@click.option(
    "--pool-idle",
    "pool_idle_seconds",
    type=float,
    default=300.0,
    show_default=True,
    envvar="HYBRID_POOL_IDLE",
    help="Seconds a pooled sandbox (and its key) may wait unused.",
)
@click.option(
    "--pool-warm",
    multiple=True,
    metavar="TIER",
    envvar="HYBRID_POOL_WARM",
    help="Pool the default spec of this container tier from the start (repeatable).",
)
@click.option(
    "--tcp",
    metavar="HOST:PORT",
    help=(
        "Also listen on TCP. Clients set HYBRID_SERVER_URL=tcp://HOST:PORT and "
        "HYBRID_SERVER_TOKEN to the token in serve-*.token next to the socket (mode 0600; "
        "`hybrid serve --status --json` names it); a connection without it never reaches a worker."
    ),
)
@click.option("--detach", is_flag=True, help="Start in the background and wait until it answers.")
@click.option("--status", is_flag=True, help="Show the running server for this configuration.")
@click.option("--stop", is_flag=True, help="Stop the running server for this configuration.")
@click.option("--quiet", is_flag=True, help="Log only warnings.")
@json_option
def serve(
    detach: bool, status: bool, stop: bool, quiet: bool, as_json: bool, **options: Any
) -> None:
    """Serve run/check/py/map/context/skeleton from warm workers over a Unix socket.

    The socket lives in a 0700 directory (HYBRID_RUNTIME_DIR, else XDG_RUNTIME_DIR/hybrid, else
    the state directory's run/); only the same user is served. The `hybrid` command starts a
    server on first use and falls back to running in process when none answers
    (HYBRID_NO_SERVER=1 or `hybrid --no-server ...` opts out).
    """
    from hybrid.server import client

    if status or stop:
        answer = client.ask("stop" if stop else "status")
        if answer is None:
            raise HybridError("no server runs for this configuration")
        if stop:
            _wait_gone(answer)
        shown = answer
        emit(shown, as_json, lambda: _render(shown, stop))
        return
    config = _config(options)
    if detach:
        args = [
            f"--{k.replace('_seconds', '').replace('_', '-')}={v}"
            for k, v in options.items()
            if v is not None and k != "pool_warm"
        ]
        args += [f"--pool-warm={t}" for t in options["pool_warm"]]
        client.start_server(*args)
        answer = _wait_up()
        emit(answer, as_json, lambda: _render(answer, False))
        return
    from hybrid.server import daemon

    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="hybrid serve %(asctime)s %(levelname)s %(message)s",
    )
    if daemon.serve(config) != 0:
        raise HybridError("a server already runs for this configuration (hybrid serve --status)")


def _config(options: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    from hybrid.errors import InvalidInput
    from hybrid.server.daemon import ServeConfig

    given = {k: v for k, v in options.items() if v is not None}
    given["pool_warm"] = list(options["pool_warm"])
    try:
        return ServeConfig(**given)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise InvalidInput(f"--{str(error['loc'][0]).replace('_', '-')}: {error['msg']}") from None


def _wait_up(timeout: float = 300.0) -> dict[str, Any]:
    from hybrid.server import client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = client.ask("status")
        if answer is not None and answer.get("ready"):  # a worker can take a command
            return answer
        time.sleep(0.1)
    raise HybridError(
        f"the server did not answer within {timeout:.0f} s (see its .log next to the socket)"
    )


def _wait_gone(answer: dict[str, Any], timeout: float = 60.0) -> None:
    from hybrid.server import client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and client.ask("status") is not None:
        time.sleep(0.1)


def _render(answer: dict[str, Any], stopped: bool) -> None:
    if stopped:
        click.echo(f"stopped server {answer.get('pid')}")
        return
    click.echo(
        f"server {answer.get('pid')} on {answer.get('socket')}: {answer.get('workers')} workers, "
        f"{answer.get('commands')} commands, up {answer.get('uptime_s')} s"
    )
    if answer.get("tcp"):
        click.echo(f"  tcp {answer['tcp']}: token in {answer.get('token_file')}")
    pool = answer.get("pool")
    if pool:
        for key in pool.get("keys", []):
            making = f", {key['making']} being made" if key.get("making") else ""
            click.echo(
                f"  pool {key['tier']} {key['image'] or 'base image'}: {key['ready']} ready{making}"
            )
        if pool.get("destroying"):
            click.echo(f"  pool: {pool['destroying']} used sandbox(es) being destroyed")
    sys.stdout.flush()
