"""Shared output helpers: every command prints either JSON (``--json``) or a readable view."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click
from pydantic import BaseModel

json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


def to_jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    return value


def emit(value: Any, as_json: bool, render: Callable[[], None]) -> None:
    """Print ``value`` as JSON, or call ``render`` for the human view."""
    if as_json:
        json.dump(to_jsonable(value), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        render()


def fail(message: str, code: int = 1) -> None:
    """Exit with ``code`` after one line on stderr (for a check that ran but failed)."""
    click.echo(message, err=True)
    raise click.exceptions.Exit(code)
