"""``hybrid engine``: bring up the Docker engine (runc + gVisor) and the base image on this host."""

from __future__ import annotations

import click

from hybrid.cli._output import emit, json_option
from hybrid.errors import EngineUnavailable


@click.group()
def engine() -> None:
    """The container tiers' engine on this host (Docker with runc and gVisor)."""


@engine.command("install")
@click.option("--dry-run", is_flag=True, help="Print the script it would run, run nothing.")
@json_option
def install_cmd(dry_run: bool, as_json: bool) -> None:
    """Install and start Docker with gVisor registered, and build the base image (root; idempotent)."""
    from hybrid.workstation import install

    path = install.script()
    if dry_run:
        shown = {"script": str(path), "command": ["bash", str(path)]}
        emit(shown, as_json, lambda: click.echo(f"bash {path}"))
        return
    code = install.install()
    if code != 0:
        raise EngineUnavailable(f"{path} failed with exit status {code} (its output is above)")
    emit({"script": str(path), "exit_code": code}, as_json, lambda: None)
