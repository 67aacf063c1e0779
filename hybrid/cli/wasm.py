"""``hybrid wasm run``: run any WASI command module under fuel, memory and time caps."""

from __future__ import annotations

from pathlib import Path

import click
from pydantic import ValidationError

from hybrid.cli._options import (
    budget_options,
    name_values,
    secret_path_option,
    secret_scope,
    spec_from_options,
)
from hybrid.cli._output import emit, exit_code_for, json_option, render_result
from hybrid.errors import InvalidInput
from hybrid.paths import display
from hybrid.policy import Mount, SandboxSpec


@click.group()
def wasm() -> None:
    """Run WASI modules in the embedded WebAssembly tier."""


def parse_dir(value: str) -> Mount:
    """HOST:GUEST[:ro|rw] -> Mount (GUEST defaults to /HOST's name, mode to ro)."""
    parts = value.split(":")
    if len(parts) > 3 or not parts[0]:
        raise InvalidInput(f"--dir {value!r}: use HOST:GUEST[:ro|rw]")
    host = Path(parts[0])
    guest = parts[1] if len(parts) > 1 and parts[1] else "/" + host.resolve().name
    mode = parts[2] if len(parts) > 2 else "ro"
    if mode not in ("ro", "rw"):
        raise InvalidInput(f"--dir {value!r}: mode must be ro or rw")
    if not host.is_dir():
        raise InvalidInput(f"--dir {value!r}: {display(host)} is not a directory")
    if display(value) != value:
        raise InvalidInput(f"--dir {value!r}: not UTF-8 (WASI grants UTF-8 paths only)")
    try:
        return Mount(source=host.resolve(), target=guest, mode=mode)
    except ValidationError as exc:
        raise InvalidInput(f"--dir {value!r}: {exc.errors()[0]['msg']}") from None


@wasm.command("run", context_settings={"ignore_unknown_options": True})
@click.argument("module", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@budget_options("fuel", "memory", "timeout", "disk")
@click.option(
    "--dir",
    "dirs",
    multiple=True,
    metavar="HOST:GUEST[:ro|rw]",
    help="Grant a host directory (read-only unless :rw, which must be under the workspace).",
)
@click.option(
    "--stdin", "stdin_file", type=click.Path(path_type=Path), help="File to feed on stdin."
)
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="NAME=VALUE",
    help="Set a variable in the guest (nothing is inherited).",
)
@secret_path_option
@json_option
def run_cmd(
    module: Path,
    args: tuple[str, ...],
    policy_file: Path | None,
    fuel: int | None,
    memory: str | None,
    timeout: float | None,
    disk: str | None,
    dirs: tuple[str, ...],
    stdin_file: Path | None,
    env_pairs: tuple[str, ...],
    allow_secret: bool,
    as_json: bool,
) -> None:
    """Run MODULE (.wasm or .wat) as a WASI command: hybrid wasm run MOD.wasm [OPTIONS] -- ARGS."""
    from hybrid.wasm import run

    spec = spec_from_options(
        policy_file,
        SandboxSpec(tier="wasm"),
        fuel=fuel,
        memory=memory,
        timeout=timeout,
        disk=disk,
    )
    mounts = [*spec.mounts, *(parse_dir(d) for d in dirs)]
    env = spec.env.model_copy(deep=True)
    for name, value in name_values(env_pairs, "--env").items():
        env.set[name] = value
        env.allow.append(name)
    spec = spec.model_copy(update={"mounts": mounts, "env": env})
    if stdin_file is not None and not stdin_file.is_file():
        raise InvalidInput(f"--stdin {display(stdin_file)}: no such file")
    with secret_scope(allow_secret):
        result = run(module, list(args), stdin=stdin_file, spec=spec, program=module.name)
    emit(result, as_json, lambda: render_result(result))
    code = exit_code_for(result)
    if code:
        raise click.exceptions.Exit(code)
