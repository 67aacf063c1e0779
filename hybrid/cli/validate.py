"""``hybrid validate``: does a real fix commit's test change catch the bug its source fixes?"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click

from hybrid.cli._options import exclude_newer_option, spec_from_options, with_exclude_newer
from hybrid.cli._output import emit, json_option


@click.command("validate")
@click.argument("repo", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.argument("commit")
@click.option(
    "--test",
    "test_command",
    help="Test command; the test files are appended, or replace {files} "
    "(default: pytest with a JUnit report; jest/mocha/tap/node --test per file for Node).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    help="Seconds each test run may take (default: the budget's).",
)
@click.option("--image", help="Workstation image (default: the base image).")
@click.option("--no-deps", is_flag=True, help="Do not install the project's dependencies.")
@exclude_newer_option
@click.option("--gvisor", is_flag=True, help="Run in gVisor (runsc) instead of runc.")
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(path_type=Path),
    help="SandboxSpec TOML (budget, [deps] policy).",
)
@json_option
def validate_cmd(
    repo: Path,
    commit: str,
    test_command: str | None,
    timeout: float | None,
    image: str | None,
    no_deps: bool,
    exclude_newer: datetime | None,
    gvisor: bool,
    policy_file: Path | None,
    as_json: bool,
) -> None:
    """Validate COMMIT of the git repository REPO: its changed tests fail at its parent and pass
    with its source change (FAIL_TO_PASS), and the tests that passed before still pass.

    Runs in a workstation at the parent with the dependencies installed offline. Exit 0 when it
    validates, 1 when it does not (with the failure class: dependency, interpreter, service,
    network, flaky, passes_at_parent, other). When today's packages cannot run its tests at all,
    it tries again with them as of the commit's date (--exclude-newer sets a date instead); when
    the image's Python cannot (its pinned runner does not run on it, or the tests use what it
    removed), on the other Python images the engine holds (hybrid image bootstrap --suite).
    """
    from hybrid.policy import SandboxSpec, enforce, for_workstation
    from hybrid.validate import validate

    tier = "gvisor" if gvisor else "docker"
    spec = spec_from_options(policy_file, SandboxSpec(tier=tier), adjust=for_workstation)
    if gvisor:
        spec = spec.model_copy(update={"tier": "gvisor"})
    spec = with_exclude_newer(spec, exclude_newer)
    enforce(spec)
    result = validate(
        repo, commit, spec=spec, image=image, deps=not no_deps, test_command=test_command
    )

    def render() -> None:
        click.echo(f"{result.commit[:12]} {result.subject}")
        click.echo(f"  tests:  {', '.join(result.tests)}")
        click.echo(f"  source: {', '.join(result.source)}")
        for run in result.runs:
            counts: dict[str, int] = {}
            for outcome in run.outcomes.values():
                counts[outcome] = counts.get(outcome, 0) + 1
            shown = ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no test ids"
            click.echo(f"  {run.state:7} exit {run.exit_code}  {shown}  ({run.seconds:.1f}s)")
        click.echo(
            f"  FAIL_TO_PASS {len(result.fail_to_pass)}  PASS_TO_PASS {len(result.pass_to_pass)}"
            f"  broken {len(result.broken)}"
        )
        if result.exclude_newer is not None:
            click.echo(f"  dependencies as of {result.exclude_newer.isoformat()}")
        verdict = "validated" if result.validated else f"not validated ({result.failure})"
        click.echo(f"{verdict}{': ' + result.reason if result.reason else ''}")

    emit(result, as_json, render)
    if not result.validated:
        raise click.exceptions.Exit(1)
