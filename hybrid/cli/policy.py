"""``hybrid policy``: check a SandboxSpec file, or write a starting one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import click

from hybrid.cli._options import TierChoice
from hybrid.cli._output import emit, json_option
from hybrid.errors import InvalidInput
from hybrid.paths import display
from hybrid.policy import SandboxSpec, admit


@click.group()
def policy() -> None:
    """Check and write sandbox policies (SandboxSpec TOML)."""


@policy.command("check")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--tier",
    type=TierChoice(auto=False),
    help="Check against this tier's limits (default: the spec's own tier).",
)
@json_option
def check(file: Path, tier: str | None, as_json: bool) -> None:
    """Print every reason FILE's spec may not run; exit 3 if there is any."""
    spec = SandboxSpec.from_toml(file)
    violations = admit(spec, tier)
    emit(
        {"file": str(file), "admitted": not violations, "violations": violations},
        as_json,
        lambda: _render(file, violations),
    )
    if violations:
        raise click.exceptions.Exit(3)


def _render(file: Path, violations: list[str]) -> None:
    if not violations:
        click.echo(f"{file}: admitted")
        return
    click.echo(f"{file}: {len(violations)} violation(s)")
    for violation in violations:
        click.echo(f"  - {violation}")


@policy.command("init")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--tier", type=TierChoice(), default="auto")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@json_option
def init(file: Path, tier: str, force: bool, as_json: bool) -> None:
    """Write a spec with the defaults (no network, no host env, 30 s, 256M) to FILE."""
    if file.exists() and not force:
        raise InvalidInput(f"{display(file)}: already exists (use --force to overwrite)")
    spec = SandboxSpec.model_validate({"tier": tier})
    _write(file, spec.to_toml())
    emit(spec, as_json, lambda: click.echo(f"wrote {display(file)}"))


def _write(file: Path, text: str) -> None:
    """Write ``file`` whole or not at all (a temporary file beside it, renamed over it)."""
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, file)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise InvalidInput(f"{display(file)}: cannot write: {exc.strerror}") from None
