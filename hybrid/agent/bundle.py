"""The evidence bundle of one run: ``run.json`` (the full report) and ``report.md`` (for a person)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from hybrid.errors import InvalidInput
from hybrid.paths import display

if TYPE_CHECKING:
    from hybrid.agent.loop import RunReport


def _fenced(text: str, lang: str = "") -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}"


def markdown(report: RunReport) -> str:
    """The run as a readable report."""
    meter = report.meter
    lines = [
        f"# {report.kind} task: {report.stop.value}",
        "",
        f"- model: `{report.model}`, mode {report.mode}, k={report.k}",
        f"- stop: **{report.stop.value}** {report.stop_detail}",
        f"- disposition: **{report.disposition}**",
        f"- steps {meter.steps}, tokens {meter.usage.input_tokens} in / "
        f"{meter.usage.output_tokens} out, cost ${meter.cost_usd:.4f}, model {meter.model_ms:.0f} ms, "
        f"sandbox {meter.sandbox_ms:.0f} ms",
        "",
        "## Task",
        "",
        report.task,
        "",
    ]
    if report.context:
        lines += ["## Context chosen", "", "| kind | path | tokens | why |", "|---|---|---|---|"]
        lines += [
            f"| {c.kind} | {c.path or ''} | {c.tokens} | {c.reason.replace('|', '/')} |"
            for c in report.context
        ]
        lines.append("")
    for attempt in report.attempts:
        lines += [
            f"## Step {attempt.step}",
            "",
            f"model {attempt.model_ms:.0f} ms, everything else {attempt.overhead_ms:.0f} ms",
            "",
        ]
        if attempt.hypothesis:
            lines += ["Hypothesis:", "", "> " + attempt.hypothesis.replace("\n", "\n> "), ""]
        for c in attempt.candidates:
            verdict = "PASSED" if c.passed else "failed"
            lines += [
                f"### Candidate {c.index}: {verdict}",
                "",
                f"tokens {c.usage.input_tokens} in / {c.usage.output_tokens} out, "
                f"cost ${c.cost_usd:.4f}, sandbox {c.sandbox_ms:.0f} ms",
                "",
            ]
            if c.code:
                lines += [_fenced(c.code, "diff" if report.kind == "repository" else "python"), ""]
            if c.problem:
                lines += [f"Problem: {c.problem}", ""]
            if c.result is not None and c.result.tests:
                lines += [
                    "| test | result |",
                    "|---|---|",
                    *(
                        f"| `{t.name}` | {'pass' if t.passed else t.message.replace('|', '/').replace(chr(10), ' ')} |"
                        for t in c.result.tests
                    ),
                    "",
                ]
            if c.evidence:
                lines += ["Evidence sent back:", "", _fenced(c.evidence), ""]
    if report.gate is not None:
        lines += ["## Gate", "", f"**{report.gate.disposition}**", ""]
        lines += [
            f"- {'pass' if c.passed else 'FAIL'} {c.name}: {c.detail}" for c in report.gate.checks
        ]
        lines.append("")
    return "\n".join(lines)


def write_bundle(report: RunReport, directory: Path) -> None:
    """Write ``run.json`` and ``report.md`` into ``directory`` (created), each atomically."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(
            f"{display(directory)}: cannot create the bundle directory ({exc.strerror})"
        ) from None
    for name, text in (
        ("run.json", report.model_dump_json(indent=2)),
        ("report.md", markdown(report)),
    ):
        partial = directory / f".{name}.partial"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, directory / name)


__all__ = ["markdown", "write_bundle"]
