"""``hybrid py``: run Python snippets (and their tests) in CPython-in-WebAssembly."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from hybrid.cli._options import budget_options, secret_path_option, secret_scope, spec_from_options
from hybrid.cli._output import emit, exit_code_for, json_option, render_result
from hybrid.errors import InvalidInput
from hybrid.paths import display, read_input, read_text_input
from hybrid.policy import SandboxSpec, enforce


@click.group()
def py() -> None:
    """Run Python snippets in the python-wasm tier (CPython 3.14 in wasmtime, a fresh instance per run)."""


def _py_options(func: Any) -> Any:
    func = click.option(
        "--file",
        "files",
        multiple=True,
        type=click.Path(path_type=Path),
        help="Input file, readable read-only by its name in the snippet's working directory.",
    )(func)
    func = click.option(
        "--test",
        "test_file",
        type=click.Path(path_type=Path),
        help="Tests: top-level assert lines and test_* functions, run in the snippet's namespace.",
    )(func)
    func = secret_path_option(func)
    return budget_options("fuel", "memory", "timeout", "output_bytes")(func)


def _spec(
    policy_file: Path | None,
    fuel: int | None,
    memory: str | None,
    timeout: float | None,
    output_bytes: str | None,
) -> SandboxSpec:
    from hybrid.wasm.python import DEFAULT_SPEC

    spec = spec_from_options(
        policy_file,
        DEFAULT_SPEC,
        fuel=fuel,
        memory=memory,
        timeout=timeout,
        output_bytes=output_bytes,
    )
    return spec.model_copy(update={"tier": "python-wasm"})


def _input_files(paths: tuple[Path, ...]) -> dict[str, bytes]:
    """--file inputs read (and judged by the secret-path rule) before the guest is prepared."""
    files: dict[str, bytes] = {}
    for path in paths:
        if display(path.name) != path.name:
            raise InvalidInput(
                f"--file {display(path)}: the name is not UTF-8, so the snippet could not open "
                "it by name (WASI names are UTF-8); rename it"
            )
        files[path.name] = read_input(path, "input file")
    return files


@contextmanager
def _first_use_status() -> Iterator[None]:
    """A status line on stderr while the guest is built/compiled for the first time (~30 s)."""
    from rich.console import Console

    from hybrid.wasm.python import component, is_ready

    if is_ready():
        component()
        yield
        return
    console = Console(stderr=True)
    if console.is_terminal:
        with console.status("preparing the python-wasm guest (one time)") as status:
            component(progress=lambda message: status.update(message))
    else:
        component(progress=lambda message: print(f"hybrid: {message}", file=sys.stderr))
    yield


def _run_and_report(source: str, filename: str, opts: dict[str, Any]) -> None:
    """Run ``source`` with the command's --test, --file and budget options; print and exit."""
    from hybrid.wasm.python import run_python

    test_file: Path | None = opts["test_file"]
    spec = _spec(
        opts["policy_file"], opts["fuel"], opts["memory"], opts["timeout"], opts["output_bytes"]
    )
    enforce(spec, "python-wasm")  # refuse before the guest is prepared (a minute, the first time)
    with secret_scope(opts["allow_secret"]):
        tests = read_text_input(test_file, "test file") if test_file is not None else None
        files = _input_files(opts["files"])
    with _first_use_status():
        result = run_python(
            source,
            tests,
            files=files,
            spec=spec,
            filename=filename,
            tests_filename=display(test_file.name) if test_file is not None else "tests.py",
        )
    emit(result, opts["as_json"], lambda: render_result(result))
    code = exit_code_for(result)
    if code:
        raise click.exceptions.Exit(code)


@py.command("run")
@click.argument("file", type=click.Path(path_type=Path))
@_py_options
@json_option
def run_cmd(file: Path, **opts: Any) -> None:
    """Run FILE.py (then its --test file) in a fresh CPython-in-WASM instance."""
    with secret_scope(opts["allow_secret"]):
        source = read_text_input(file, "file")
    _run_and_report(source, display(file.name), opts)


@py.command("eval")
@click.argument("code")
@_py_options
@json_option
def eval_cmd(code: str, **opts: Any) -> None:
    """Run CODE (a string; '-' reads it from stdin) in a fresh CPython-in-WASM instance."""
    _run_and_report(sys.stdin.read() if code == "-" else code, "<eval>", opts)


@py.command("build")
@click.option("--force", is_flag=True, help="Rebuild even if a component for these sources exists.")
@json_option
def build_cmd(force: bool, as_json: bool) -> None:
    """Build (componentize-py) and compile the python-wasm guest now instead of at first use."""
    import time

    from hybrid.wasm.python import guest

    start = time.perf_counter()
    if force:
        guest.reset()
        guest.build(force=True, progress=lambda message: click.echo(f"hybrid: {message}", err=True))
    with _first_use_status():
        pass
    path = guest.component_path()
    size = path.stat().st_size
    info = {
        "component": str(path),
        "bytes": size,
        "fingerprint": guest.fingerprint(),
        "seconds": round(time.perf_counter() - start, 2),
    }
    emit(
        info,
        as_json,
        lambda: click.echo(
            f"python-wasm guest ready: {path} ({size / 1e6:.1f} MB, {info['seconds']} s)"
        ),
    )


@py.command("modules")
@json_option
def modules_cmd(as_json: bool) -> None:
    """List the standard library modules bundled in the python-wasm guest."""
    from hybrid.wasm.python import available_modules

    with _first_use_status():
        names = available_modules()
    emit(names, as_json, lambda: click.echo("\n".join(names)))
