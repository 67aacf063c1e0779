"""Options shared by the commands that run something (budgets, dependency resolution), and the
spec they build."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from hybrid.errors import InvalidInput
from hybrid.policy import (
    Budget,
    DepsPolicy,
    NetworkPolicy,
    SandboxSpec,
    allow_secret_paths,
    moment,
)


class TierChoice(click.Choice[str]):
    """A --tier choice read from the tier registry when used, so a registered tier is offered."""

    def __init__(self, auto: bool = True) -> None:
        self.auto = auto
        super().__init__((), case_sensitive=True)

    @property
    def choices(self) -> tuple[str, ...]:
        from hybrid import tiers

        return ("auto", *tiers.names()) if self.auto else tiers.names()

    @choices.setter
    def choices(self, _: object) -> None:
        pass  # the registry is the list


_OPTIONS = {
    "timeout": click.option("--timeout", type=float, help="Wall-clock deadline in seconds."),
    "memory": click.option("--memory", help="Memory cap, e.g. 256M."),
    "fuel": click.option("--fuel", type=int, help="WebAssembly fuel (roughly instructions)."),
    "pids": click.option("--pids", type=int, help="Maximum processes."),
    "cpus": click.option("--cpus", type=float, help="CPU share in cores."),
    "output_bytes": click.option("--output-bytes", help="Bytes kept of stdout and of stderr."),
    "disk": click.option(
        "--disk",
        metavar="SIZE",
        help="Disk cap of the writable area, e.g. 2G (default 2G for a workspace, 64M for WASM scratch).",
    ),
    "allow": click.option(
        "--allow",
        multiple=True,
        metavar="HOST[:PORT]",
        help="Egress to HOST through the allow-list proxy (repeatable; docker tier).",
    ),
}
# Budget fields whose option has another name.
_FIELD_FOR = {"timeout": "wall_seconds"}
_OPTION_FOR = {field: f"--{name}" for name, field in _FIELD_FOR.items()}


def budget_options(*names: str) -> Callable[[Any], Any]:
    """Decorator adding --policy and the named budget options (timeout, memory, fuel, ...)."""

    def decorate(func: Any) -> Any:
        for name in reversed(names):
            func = _OPTIONS[name](func)
        return click.option(
            "--policy",
            "policy_file",
            type=click.Path(path_type=Path),
            help="SandboxSpec TOML to start from.",
        )(func)

    return decorate


def spec_from_options(
    policy_file: Path | None,
    default: SandboxSpec,
    allow: tuple[str, ...] = (),
    adjust: Callable[[SandboxSpec], SandboxSpec] | None = None,
    **values: Any,
) -> SandboxSpec:
    """The policy file's spec (or ``default``) with the budget options that were given applied.

    ``adjust`` (e.g. ``policy.for_workstation``) sees the spec before the options, so it can
    tell the fields the file set from the defaults it left.
    """
    spec = SandboxSpec.from_toml(policy_file) if policy_file else default
    if adjust is not None:
        spec = adjust(spec)
    overrides = {_FIELD_FOR.get(k, k): v for k, v in values.items() if v is not None}
    try:
        budget = Budget.model_validate(spec.budget.model_dump() | overrides)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0])
        option = _OPTION_FOR.get(field, "--" + field.replace("_", "-"))
        raise InvalidInput(f"{option}: {error['msg'].removeprefix('Value error, ')}") from None
    update: dict[str, Any] = {"budget": budget}
    if allow:
        update["network"] = NetworkPolicy(mode="egress", allow=[*spec.network.allow, *allow])
    return spec.model_copy(update=update)


def name_values(values: tuple[str, ...], option: str) -> dict[str, str]:
    """``NAME=VALUE`` option values as a dict; one malformed value raises one InvalidInput line."""
    parsed: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidInput(f"{option} {item!r}: use NAME=VALUE")
        parsed[name] = value
    return parsed


secret_path_option = click.option(
    "--allow-secret-path",
    "allow_secret",
    is_flag=True,
    help="Let input files and grants name host secret paths (~/.ssh, /etc/shadow, ...); logged.",
)
"""--allow-secret-path: the explicit override of the secret-path rule for inputs (see secret_scope)."""


def secret_scope(allowed: bool) -> AbstractContextManager[None]:
    """Inside: inputs and mounts may name host secret paths (each use is logged) when ``allowed``."""
    return allow_secret_paths() if allowed else nullcontext()


def _when(_ctx: click.Context, _param: click.Parameter, value: str | None) -> datetime | None:
    try:
        return None if value is None else moment(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


exclude_newer_option = click.option(
    "--exclude-newer",
    metavar="DATE",
    callback=_when,
    help="Resolve the packages the project names as of DATE (ISO; UTC unless it says): "
    "nothing published after it.",
)


def with_exclude_newer(spec: SandboxSpec, when: datetime | None) -> SandboxSpec:
    """``spec`` with its dependency policy resolving as of ``when`` (unchanged when None)."""
    if when is None:
        return spec
    deps = (spec.deps or DepsPolicy()).model_copy(update={"exclude_newer": when})
    return spec.model_copy(update={"deps": deps})
