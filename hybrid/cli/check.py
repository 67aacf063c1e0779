"""``hybrid check``: the built-in checks (csv, json, grep, redact, scope) in WebAssembly.

Exit status: 0 the check passed (grep: something matched), 1 it found problems (grep: nothing
matched), 2 bad input, 4 the sandboxed run ended abnormally (out of fuel, deadline, memory).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from hybrid import checks
from hybrid.cli._options import budget_options, secret_path_option, secret_scope, spec_from_options
from hybrid.cli._output import emit, json_option, to_jsonable
from hybrid.errors import ExecutionError, InvalidInput
from hybrid.paths import printable
from hybrid.policy import Budget, SandboxSpec
from hybrid.results import Termination


@click.group()
def check() -> None:
    """Built-in checks (csv, json, grep, redact, scope) in WebAssembly."""


def _check_options(func: Callable[..., None]) -> Callable[..., None]:
    """--policy, --fuel, --memory, --timeout, --allow-secret-path and --json for a check.

    The command receives the budget they make as ``budget`` (None when none was given: the
    module's defaults) and runs inside the secret-path scope --allow-secret-path asks for.
    """

    @functools.wraps(func)
    def command(
        *,
        policy_file: Path | None,
        fuel: int | None,
        memory: str | None,
        timeout: float | None,
        allow_secret: bool,
        **kwargs: Any,
    ) -> None:
        budget = None
        if policy_file is not None or any(v is not None for v in (fuel, memory, timeout)):
            default = SandboxSpec(tier="wasm")
            budget = spec_from_options(
                policy_file, default, fuel=fuel, memory=memory, timeout=timeout
            ).budget
        with secret_scope(allow_secret):
            func(budget=budget, **kwargs)

    return budget_options("fuel", "memory", "timeout")(secret_path_option(json_option(command)))


def _data(path: str) -> checks.Data:
    """A file argument: ``-`` reads stdin."""
    if path == "-":
        return sys.stdin.buffer.read()
    return Path(path)


def _split(values: str | None) -> list[str]:
    return [v.strip() for v in (values or "").split(",") if v.strip()]


def _types(values: str | None) -> dict[str, str]:
    types = {}
    for item in _split(values):
        column, sep, kind = item.partition("=")
        if not sep or not column or not kind:
            raise InvalidInput(
                f"--types {item!r}: use COLUMN=TYPE (int, float, bool, date, string)"
            )
        types[column] = kind
    return types


def _finish(
    report: checks.CheckReport, as_json: bool, render: Callable[[], None], passed: bool
) -> None:
    if report.termination is not Termination.OK:
        try:
            report.raise_for_termination()
        except ExecutionError as exc:
            if as_json:  # the report and the error; the human view of a cut-short run would mislead
                error = {"type": type(exc).__name__, "message": exc.message, "exit_code": 4}
                emit({**to_jsonable(report), "error": error}, True, render)
            click.echo(f"hybrid: error: {exc.message}", err=True)
        raise click.exceptions.Exit(4)
    emit(report, as_json, render)
    if not passed:
        raise click.exceptions.Exit(1)


def _usage_line(report: checks.CheckReport) -> str:
    fuel = f", fuel {report.usage.fuel_used:,}" if report.usage.fuel_used is not None else ""
    return f"({report.usage.wall_ms:.1f} ms in wasm{fuel})"


@check.command("csv")
@click.argument("file")
@click.option("--require", help="Comma-separated columns that must exist.")
@click.option(
    "--types", "types_", help="Comma-separated COLUMN=TYPE (int, float, bool, date, string)."
)
@click.option("--delimiter", default=",", show_default=True, help="One character; 'tab' for tabs.")
@click.option("--allow-empty", is_flag=True, help="Empty cells pass the type checks.")
@_check_options
def csv_cmd(
    file: str,
    require: str | None,
    types_: str | None,
    delimiter: str,
    allow_empty: bool,
    budget: Budget | None,
    as_json: bool,
) -> None:
    """Check a CSV FILE (or - for stdin): header, required columns, types, first bad row."""
    report = checks.check_csv(
        _data(file),
        require=_split(require),
        types=_types(types_),
        delimiter=delimiter,
        allow_empty=allow_empty,
        budget=budget,
    )

    def render() -> None:
        click.echo(f"columns: {', '.join(report.columns) or '(none)'}")
        click.echo(f"rows:    {report.rows}")
        if report.missing:
            click.echo(f"missing: {', '.join(report.missing)}")
        if report.first_bad_row is not None:
            bad = report.first_bad_row
            click.echo(f"first bad row: line {bad.line}: {bad.reason}")
        for problem in report.problems:
            click.echo(f"problem: {problem}")
        click.echo(("ok " if report.ok else "FAILED ") + _usage_line(report))

    _finish(report, as_json, render, report.ok)


@check.command("json")
@click.argument("file")
@click.option(
    "--schema",
    "schema_file",
    type=click.Path(path_type=Path),
    help="A JSON schema (small subset) to validate against.",
)
@click.option("--max-errors", default=100, show_default=True, help="Failures to list.")
@_check_options
def json_cmd(
    file: str,
    schema_file: Path | None,
    max_errors: int,
    budget: Budget | None,
    as_json: bool,
) -> None:
    """Parse a JSON FILE (or - for stdin) and validate it against --schema."""
    report = checks.check_json(
        _data(file),
        schema=schema_file,
        max_errors=max_errors,
        budget=budget,
    )

    def render() -> None:
        if report.syntax_error is not None:
            err = report.syntax_error
            click.echo(f"{file}:{err.line}:{err.column}: not valid JSON: {err.message}")
        for failure in report.errors:
            click.echo(f"{failure.path}: {failure.message}")
        if report.error_count > len(report.errors):
            click.echo(f"... and {report.error_count - len(report.errors)} more")
        click.echo(("ok " if report.ok else "FAILED ") + _usage_line(report))

    _finish(report, as_json, render, report.ok)


@check.command("grep")
@click.argument("pattern")
@click.argument("directory", required=False)
@click.option(
    "-C", "--context", default=0, show_default=True, help="Lines of context around each match."
)
@click.option("-i", "--ignore-case", is_flag=True)
@click.option(
    "--glob",
    "globs",
    multiple=True,
    help="Only paths matching this glob (repeatable), e.g. '*.py'.",
)
@click.option(
    "--max",
    "max_matches",
    default=1000,
    show_default=True,
    help="Stop after this many matching lines.",
)
@_check_options
def grep_cmd(
    pattern: str,
    directory: str | None,
    context: int,
    ignore_case: bool,
    globs: tuple[str, ...],
    max_matches: int,
    budget: Budget | None,
    as_json: bool,
) -> None:
    """Search DIRECTORY (default .) or one file for PATTERN with a linear-time regex, read-only.

    Paths print as given: under DIRECTORY as it was written (none: relative to .), a file by
    the name it was given. --json keeps the report's paths, relative to what was searched.
    """
    report = checks.grep(
        pattern,
        directory or ".",
        ignore_case=ignore_case,
        context=context,
        max_matches=max_matches,
        globs=globs,
        budget=budget,
    )

    def shown(path: str) -> str:
        # A file name with an escape sequence or a newline must not act on the terminal or
        # forge a match line.
        if directory is None:
            return printable(path)
        if not Path(directory).is_dir():
            return printable(directory)
        return printable(directory) + ("" if directory.endswith("/") else "/") + printable(path)

    def render() -> None:
        for m in report.matches:
            path = shown(m.path)
            first = m.line - len(m.before)
            for offset, line in enumerate(m.before):
                click.echo(f"{path}-{first + offset}-{line}")
            click.echo(f"{path}:{m.line}:{m.column}:{m.text}")
            for offset, line in enumerate(m.after):
                click.echo(f"{path}-{m.line + 1 + offset}-{line}")
            if context:
                click.echo("--")
        more = " (stopped at --max)" if report.truncated else ""
        click.echo(
            f"{len(report.matches)} matching lines in {report.files_matched} of "
            f"{report.files_scanned} files{more}{_skipped(report)} {_usage_line(report)}",
            err=True,
        )

    _finish(report, as_json, render, report.found)


def _skipped(report: checks.GrepReport) -> str:
    """What the search did not read, so a short count is never mistaken for a full one."""
    parts = [
        f"{n} {what}"
        for n, what in (
            (report.binary_skipped, "binary"),
            (report.large_skipped, "too large"),
        )
        if n
    ]
    parts += [f"unreadable: {printable(entry)}" for entry in report.unreadable[:3]]
    if len(report.unreadable) > 3:
        parts.append(f"{len(report.unreadable) - 3} more unreadable (see --json)")
    return f" (skipped {', '.join(parts)})" if parts else ""


@check.command("redact")
@click.argument("file", default="-")
@click.option(
    "--literal",
    "literals",
    multiple=True,
    help="A value to scrub wherever it appears (repeatable).",
)
@click.option(
    "--max-bytes",
    default=32 * 1024,
    show_default=True,
    help="Keep at most this much (head and tail).",
)
@click.option("--no-entropy", is_flag=True, help="Do not scrub high-entropy tokens.")
@click.option("--label", help="Source label put on the evidence marker.")
@_check_options
def redact_cmd(
    file: str,
    literals: tuple[str, ...],
    max_bytes: int,
    no_entropy: bool,
    label: str | None,
    budget: Budget | None,
    as_json: bool,
) -> None:
    """Scrub secrets from FILE (default stdin), bound it and wrap it as untrusted evidence."""
    report = checks.redact(
        _data(file),
        literals=literals,
        max_bytes=max_bytes,
        entropy=not no_entropy,
        label=label,
        budget=budget,
    )

    def render() -> None:
        click.echo(report.text)
        counts = ", ".join(f"{kind} {n}" for kind, n in sorted(report.counts.items())) or "nothing"
        cut = f"; cut {report.cut_bytes} bytes" if report.truncated else ""
        click.echo(f"redacted: {counts}{cut}", err=True)

    _finish(report, as_json, render, True)


@check.command("scope")
@click.argument("diff")
@click.option(
    "--allow", "allow", multiple=True, help="Allowed path prefix (repeatable); default: anywhere."
)
@click.option(
    "--deny", "deny", multiple=True, help="Extra denied glob (repeatable), e.g. 'docs/**'."
)
@click.option("--allow-lockfiles", is_flag=True, help="Let the patch touch lockfiles.")
@click.option(
    "--no-default-deny",
    is_flag=True,
    help="Drop the built-in denied globs (.env*, CI, credentials, lockfiles).",
)
@_check_options
def scope_cmd(
    diff: str,
    allow: tuple[str, ...],
    deny: tuple[str, ...],
    allow_lockfiles: bool,
    no_default_deny: bool,
    budget: Budget | None,
    as_json: bool,
) -> None:
    """Decide whether the unified DIFF (a file, or - for stdin) is reviewable or blocked."""
    report = checks.scope(
        _data(diff),
        allow=allow,
        deny=deny,
        allow_lockfiles=allow_lockfiles,
        default_deny=not no_default_deny,
        empty_ok=True,
        budget=budget,
    )
    if report.decision == "empty":
        # `git diff | hybrid check scope -` on a clean tree: nothing to review is not bad input.
        click.echo("hybrid: note: empty diff: nothing to review", err=True)

    def render() -> None:
        for f in report.files:
            name = f"{f.old_path} -> {f.path}" if f.old_path else f.path
            binary = " binary" if f.binary else ""
            click.echo(f"{f.status:<9} {name}  +{f.additions} -{f.deletions}{binary}")
        for v in report.violations:
            click.echo(f"violation: {v.path}: {v.rule}" + (f" ({v.pattern})" if v.pattern else ""))
        if report.decision != "empty":
            click.echo(f"{report.decision} {_usage_line(report)}")

    _finish(report, as_json, render, report.ok)
