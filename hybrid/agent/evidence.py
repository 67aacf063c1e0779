"""Evidence for the model: what a candidate's run showed, bounded, redacted and marked untrusted.

Everything a sandbox printed is untrusted (a candidate can print instructions aimed at the model),
so it goes through the ``redact`` check, which scrubs secrets, bounds the length and wraps the
text in ``<untrusted-evidence>`` markers that the text itself cannot close.
"""

from __future__ import annotations

import hashlib

from hybrid.results import ExecutionResult, Termination

EVIDENCE_BYTES = 6 * 1024
"""Bytes of evidence one candidate's run may send back to the model."""

OUTPUT_CHARS = 1500
"""Characters kept of each of stdout and stderr (their tail, where the error usually is)."""


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "[... cut ...]\n" + text[-limit:]


def describe(result: ExecutionResult) -> str:
    """A run as plain text: how it ended, each failing test with its message, the traceback
    (python-wasm keeps only the candidate's own frames), then the output's tail."""
    lines: list[str] = []
    failed = [t for t in result.tests if not t.passed]
    if result.tests:
        lines.append(f"tests: {len(result.tests) - len(failed)} of {len(result.tests)} passed")
    for test in failed:
        lines.append(f"FAIL {test.name}: {test.message}")
    if result.termination is not Termination.OK or (result.exit_code and not result.tests):
        lines.append(f"run ended: {result.termination.value} {result.detail}".rstrip())
    if result.traceback:
        lines.append(result.traceback.rstrip("\n"))
    for name, text, cut in (
        ("stdout", result.stdout, result.stdout_truncated),
        ("stderr", result.stderr, result.stderr_truncated),
    ):
        if text.strip():
            lines.append(f"--- {name}{' (cut at the output cap)' if cut else ''} ---")
            lines.append(_tail(text.rstrip("\n"), OUTPUT_CHARS))
    return "\n".join(lines)


def wrap(text: str, label: str, literals: tuple[str, ...] = ()) -> str:
    """``text`` redacted, bounded and wrapped as untrusted evidence (the ``redact`` check)."""
    from hybrid.checks import redact

    report = redact(text, literals=literals, max_bytes=EVIDENCE_BYTES, label=label)
    if not report.ok:  # the check itself failed: send nothing rather than raw output
        return f'<untrusted-evidence source="{label}">\n[evidence withheld: {report.detail}]\n</untrusted-evidence>'
    return report.text


def signature(result: ExecutionResult) -> str:
    """What identifies a failure across attempts: how the run ended, the failing tests and their
    error types, the last traceback line (not the values, which change with each edit)."""
    parts = [result.termination.value]
    for test in result.tests:
        if not test.passed:
            parts.append(f"{test.name}|{test.message.split(':', 1)[0]}")
    if result.traceback:
        last = result.traceback.rstrip().splitlines()[-1]
        parts.append(last.split(":", 1)[0])
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


__all__ = ["EVIDENCE_BYTES", "describe", "signature", "wrap"]
