"""Built-in checks (csv, json, grep, redact, scope), each run in a fuel- and memory-capped WASI module.

Every call returns a report with ``ok`` (the check passed), its findings, and how the run ended
(``termination``, ``usage``). A request the module rejects raises the matching InvalidInput
(``InvalidPattern`` for a bad regex, ``InvalidDiff`` for a malformed diff). A run that ends
abnormally (out of fuel, past its deadline, out of memory) is not an exception: the report says
so with ``ok=False`` and its ``termination``; ``report.raise_for_termination()`` turns it into the
matching ExecutionError.

The data a check reads is given one of two ways, never guessed: ``path=`` names a file to read
(``str`` or ``os.PathLike``); the positional argument holds the data itself (``str`` or
``bytes``; a ``pathlib.Path`` there is read as a file too). ``check_csv("rates.csv")`` is
refused with a pointer to ``path=`` rather than checked as a one-line CSV.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from hybrid.errors import (
    ExecTimeout,
    ExecutionError,
    InvalidDiff,
    InvalidInput,
    InvalidPattern,
    OutOfFuel,
    OutOfMemory,
)
from hybrid.markers import neutralise
from hybrid.paths import display, open_input, read_input
from hybrid.policy import Budget, Mount, SandboxSpec, check_input_path
from hybrid.results import Termination, Usage
from hybrid.wasm import builtins
from hybrid.wasm.runtime import run

log = logging.getLogger(__name__)
Data = str | bytes | os.PathLike[str]
R = TypeVar("R", bound="CheckReport")


class _Model(BaseModel):
    # Built on first use, not at import: a `hybrid check` process validates one report type.
    model_config = ConfigDict(extra="ignore", defer_build=True)


class CheckReport(_Model):
    """What every check reports: the verdict and how the sandboxed run ended."""

    ok: bool = Field(description="The check passed (and the run ended normally).")
    termination: Termination = Field(Termination.OK, description="How the module run ended.")
    usage: Usage = Field(description="Wall time, fuel and memory of the module run.")
    detail: str = Field("", description="Why the run ended abnormally, when it did.")

    def raise_for_termination(self: R) -> R:
        """Raise the matching ExecutionError unless the run ended normally; return self otherwise."""
        if self.termination is Termination.OK:
            return self
        error = {
            Termination.TIMEOUT: ExecTimeout,
            Termination.OUT_OF_FUEL: OutOfFuel,
            Termination.OUT_OF_MEMORY: OutOfMemory,
        }.get(self.termination, ExecutionError)
        raise error(f"check ended with {self.termination.value}: {self.detail}", result=self)


class BadRow(_Model):
    """The first row that failed: ragged, or a value of the wrong type."""

    line: int = Field(description="1-based line number in the file.")
    row: int = Field(description="1-based data row (the header is row 0).")
    reason: str
    column: str | None = None
    value: str | None = None
    expected: str | None = None


class CsvReport(CheckReport):
    """Result of ``check_csv``."""

    columns: list[str] = Field(default_factory=list, description="The header, in order.")
    missing: list[str] = Field(
        default_factory=list, description="Required or typed columns not in the header."
    )
    duplicate_columns: list[str] = Field(default_factory=list)
    rows: int = Field(0, description="Data rows (header excluded).")
    bad_rows: int = 0
    first_bad_row: BadRow | None = None
    problems: list[str] = Field(default_factory=list, description="One readable line per problem.")


class JsonSyntaxError(_Model):
    """Where a document stops being JSON."""

    line: int
    column: int
    message: str


class JsonFailure(_Model):
    """One schema failure at a JSON path such as ``$.items[2].name``."""

    path: str
    keyword: str
    message: str


class JsonReport(CheckReport):
    """Result of ``check_json``."""

    valid_json: bool = False
    syntax_error: JsonSyntaxError | None = None
    root_type: str | None = None
    schema_checked: bool = False
    errors: list[JsonFailure] = Field(default_factory=list)
    error_count: int = Field(0, description="All failures, including any beyond max_errors.")


class GrepMatch(_Model):
    """One matching line with its context."""

    path: str = Field(description="Path relative to the searched directory.")
    line: int
    column: int = Field(description="1-based column of the first match, in characters.")
    text: str
    match: str
    before: list[str] = Field(default_factory=list)
    after: list[str] = Field(default_factory=list)


class GrepReport(CheckReport):
    """Result of ``grep``; ``ok`` means the search ran, ``found`` that something matched."""

    pattern: str = ""
    found: bool = False
    matches: list[GrepMatch] = Field(default_factory=list)
    files_scanned: int = 0
    files_matched: int = 0
    binary_skipped: int = 0
    large_skipped: int = 0
    unreadable: list[str] = Field(default_factory=list)
    truncated: bool = Field(False, description="max_matches was reached.")


class RedactReport(CheckReport):
    """Result of ``redact``: the scrubbed, bounded text wrapped in an untrusted-evidence marker."""

    text: str = ""
    counts: dict[str, int] = Field(
        default_factory=dict, description="Redactions per kind of secret."
    )
    redactions: int = 0
    markers_neutralised: int = 0
    input_bytes: int = 0
    truncated: bool = False
    cut_bytes: int = 0


class TouchedFile(_Model):
    """One path a diff touches."""

    path: str
    old_path: str | None = None
    status: Literal["added", "modified", "deleted", "renamed", "copied"]
    binary: bool = False
    additions: int = 0
    deletions: int = 0
    old_mode: str | None = None
    new_mode: str | None = None
    similarity: str | None = None


class ScopeViolation(_Model):
    """A path the policy does not allow, and the rule that says so."""

    path: str
    rule: str = Field(
        description="env-file, ci-config, credential-file, lockfile, git-internals, denied-glob, outside-allowed-prefixes or path-escape."
    )
    pattern: str | None = None
    message: str


class ScopeReport(CheckReport):
    """Result of ``scope``."""

    decision: Literal["reviewable", "blocked", "empty"] = Field(
        "blocked", description="empty: the diff changes nothing (only with empty_ok=True)."
    )
    files: list[TouchedFile] = Field(default_factory=list)
    violations: list[ScopeViolation] = Field(default_factory=list)
    additions: int = 0
    deletions: int = 0


_ERRORS: dict[str, type[InvalidInput]] = {"pattern": InvalidPattern, "diff": InvalidDiff}


def _spec(budget: Budget | None, mounts: Sequence[Mount] = ()) -> SandboxSpec | None:
    if budget is None and not mounts:
        return None  # the runtime's default spec: admitted once, the fast path
    return SandboxSpec(tier="wasm", budget=budget or Budget(), mounts=list(mounts))


def _utf8_name(path: Path) -> bool:
    try:
        os.fspath(path).encode()
    except UnicodeEncodeError:
        return False
    return True


def _stdin(
    data: Data | None, path: str | os.PathLike[str] | None, what: str, name_guard: bool = True
) -> bytes | Path:
    """The module's stdin: the data itself, or the file it names (see the module docstring)."""
    if (data is None) == (path is None):
        raise InvalidInput(f"give the {what} either as data or as path=, not both or neither")
    if path is not None:
        data = Path(path)
    elif isinstance(data, str) and name_guard and "\n" not in data and _names_a_file(data):
        raise InvalidInput(
            f"{display(data)!r} is the name of a file, not {what} text: "
            f"pass path={display(data)!r} to read it"
        )
    assert data is not None
    if isinstance(data, str | bytes):
        return data.encode() if isinstance(data, str) else data
    path = Path(data)
    if not path.is_file():
        problem = "no such file" if not path.exists() else "not a file"
        raise InvalidInput(f"{display(path)}: {problem}")
    if not _utf8_name(path):
        return read_input(path, "input file")  # WASI names are UTF-8: hand over the bytes
    check_input_path(path)
    return path


def _names_a_file(text: str) -> bool:
    try:
        return 0 < len(text) < 4096 and Path(text).is_file()
    except (OSError, ValueError):  # a NUL byte, a name too long
        return False


def _run(
    name: str,
    report: type[R],
    request: Mapping[str, Any],
    *,
    stdin: bytes | Path | None = None,
    budget: Budget | None = None,
    mounts: Sequence[Mount] = (),
) -> R:
    result = run(
        builtins.module(name),
        [json.dumps(request, separators=(",", ":"))],
        stdin=stdin,
        spec=_spec(budget, mounts),
        program=name,
    )
    log.debug(
        "check %s: %s in %.2f ms, fuel %s",
        name,
        result.termination.value,
        result.usage.wall_ms,
        result.usage.fuel_used,
    )
    if result.termination is not Termination.OK and result.exit_code != 2:
        return report(
            ok=False, termination=result.termination, usage=result.usage, detail=result.detail
        )
    try:
        data = json.loads(result.stdout)
    except ValueError:
        raise ExecutionError(
            f"check {name} printed no report ({result.termination.value}: {result.detail})",
            result=result,
        ) from None
    if result.exit_code == 2 or "error" in data:
        raise _ERRORS.get(data.get("kind", ""), InvalidInput)(str(data.get("error", "bad input")))
    data["usage"] = result.usage
    return report.model_validate(data)


def check_csv(
    data: Data | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
    require: Sequence[str] = (),
    types: Mapping[str, str] | None = None,
    delimiter: str = ",",
    allow_empty: bool = False,
    budget: Budget | None = None,
) -> CsvReport:
    """Check a CSV: required columns, column types (int, float, bool, date, string), row count, first bad row.

    ``data`` is the CSV itself; ``path`` names a file holding it (give one).
    """
    request = {
        "require": list(require),
        "types": dict(types or {}),
        "delimiter": delimiter,
        "allow_empty": allow_empty,
    }
    return _run("csv", CsvReport, request, stdin=_stdin(data, path, "CSV"), budget=budget)


def check_json(
    document: Data | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
    schema: Mapping[str, Any] | os.PathLike[str] | None = None,
    max_errors: int = 100,
    budget: Budget | None = None,
) -> JsonReport:
    """Parse a JSON document and validate it against a small schema; failures carry their JSON path.

    ``document`` is the JSON itself; ``path`` names a file holding it (give one).
    """
    if schema is not None and not isinstance(schema, Mapping):
        schema = _load_schema(Path(schema))
    request = {"schema": dict(schema) if schema is not None else None, "max_errors": max_errors}
    return _run("json", JsonReport, request, stdin=_stdin(document, path, "JSON"), budget=budget)


def _load_schema(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(read_input(path, "schema file"))
    except ValueError as exc:  # also UnicodeDecodeError
        raise InvalidInput(f"{path}: schema is not valid JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise InvalidInput(f"{path}: a schema must be a JSON object")
    return loaded


def grep(
    pattern: str,
    root: str | os.PathLike[str] = ".",
    *,
    ignore_case: bool = False,
    context: int = 0,
    max_matches: int = 1000,
    globs: Sequence[str] = (),
    budget: Budget | None = None,
) -> GrepReport:
    """Search a directory (or one file) read-only with a linear-time regex; file:line:col and context."""
    path = Path(root)
    if not path.exists():
        raise InvalidInput(f"{display(path)}: no such file or directory")
    request: dict[str, Any] = {
        "pattern": pattern,
        "ignore_case": ignore_case,
        "context": context,
        "max_matches": max_matches,
        "globs": list(globs),
    }
    with tempfile.TemporaryDirectory(prefix="hybrid-grep-") as tmp:
        if path.is_dir():
            grant = path
            if not _utf8_name(path):
                # WASI grants UTF-8 paths only: reach the directory through a link of our own
                # (admit() judges the mount by where the link resolves).
                grant = Path(tmp) / "root"
                grant.symlink_to(path.absolute())
        else:
            # One file: grant a directory holding only a copy of it, never its siblings. The
            # copy's name is the file's with bytes that are not UTF-8 replaced (WASI needs UTF-8).
            name = os.fsencode(path.name).decode("utf-8", "replace")
            with open_input(path, "file to search") as src, open(Path(tmp) / name, "wb") as dst:
                shutil.copyfileobj(src, dst)
            request["paths"] = [name]
            grant = Path(tmp)
        report = _run(
            "grep", GrepReport, request, budget=budget, mounts=[Mount(source=grant, target="/data")]
        )
    report.unreadable = [
        f"{entry} (a name in it is not UTF-8, which WASI cannot list)"
        if "cannot list: Illegal byte sequence" in entry
        else entry
        for entry in report.unreadable
    ]
    return report


def redact(
    text: Data | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
    literals: Sequence[str] = (),
    max_bytes: int = 32 * 1024,
    entropy: bool = True,
    label: str | None = None,
    budget: Budget | None = None,
) -> RedactReport:
    """Scrub secrets, bound the length and wrap the text in ``<untrusted-evidence>`` markers.

    ``text`` is the text itself; ``path`` names a file holding it (give one).
    """
    request = {
        "literals": list(literals),
        "max_bytes": max_bytes,
        "entropy": entropy,
        "label": label,
    }
    # Any text may be redacted, a file name too: no guard against one.
    stdin = _stdin(text, path, "text", name_guard=False)
    raw = stdin if isinstance(stdin, bytes) else read_input(stdin, "text file")
    # Marker look-alikes (zero-width characters, fullwidth or Cyrillic letters) the module's
    # ASCII pattern cannot see are neutralised here first (hybrid.markers).
    decoded = raw.decode("utf-8", "replace")
    cleaned, lookalikes = neutralise(decoded)
    if lookalikes:
        raw = cleaned.encode()
    report = _run("redact", RedactReport, request, stdin=raw, budget=budget)
    report.markers_neutralised += lookalikes
    return report


def scope(
    diff: Data | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
    allow: Sequence[str] = (),
    deny: Sequence[str] = (),
    allow_lockfiles: bool = False,
    default_deny: bool = True,
    empty_ok: bool = False,
    budget: Budget | None = None,
) -> ScopeReport:
    """Parse a unified diff, list the touched paths and decide reviewable or blocked.

    ``diff`` is the diff itself; ``path`` names a file holding it (give one). An empty diff
    (whitespace only) raises InvalidDiff, unless ``empty_ok``: then it is ``decision="empty"``,
    ``ok`` (nothing to review), and no module runs.
    """
    request = {
        "allow": list(allow),
        "deny": list(deny),
        "allow_lockfiles": allow_lockfiles,
        "default_deny": default_deny,
    }
    stdin = _stdin(diff, path, "diff")
    if empty_ok:
        raw = stdin if isinstance(stdin, bytes) else read_input(stdin, "diff")
        if not raw.strip():
            return ScopeReport(ok=True, decision="empty", usage=Usage(wall_ms=0.0))
        stdin = raw
    return _run("scope", ScopeReport, request, stdin=stdin, budget=budget)


__all__ = [
    "BadRow",
    "CheckReport",
    "CsvReport",
    "GrepMatch",
    "GrepReport",
    "JsonFailure",
    "JsonReport",
    "JsonSyntaxError",
    "RedactReport",
    "ScopeReport",
    "ScopeViolation",
    "TouchedFile",
    "check_csv",
    "check_json",
    "grep",
    "redact",
    "scope",
]
