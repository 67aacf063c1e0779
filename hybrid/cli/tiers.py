"""``hybrid run``, ``hybrid route`` and ``hybrid doctor``: the router and the host's tiers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from hybrid.cli._options import TierChoice, budget_options, spec_from_options
from hybrid.cli._output import (
    emit,
    exit_code_for,
    json_option,
    live_output,
    reader_gone,
    render_result,
)
from hybrid.errors import InvalidInput
from hybrid.policy import SandboxSpec


def container_spec(
    opts: dict[str, Any], tier: str = "auto", *, workstation: bool = False
) -> SandboxSpec:
    """The spec for a sandbox from --policy and the budget options (see sandbox_options).

    ``workstation``: budget fields neither the file nor an option sets take the workstation
    defaults (policy.WORKSTATION_BUDGET), sized for a real test suite.
    """
    from hybrid.policy import for_workstation

    default = SandboxSpec(tier=tier)
    spec = spec_from_options(
        opts["policy_file"],
        default,
        opts["allow"],
        adjust=for_workstation if workstation else None,
        timeout=opts["timeout"],
        memory=opts["memory"],
        pids=opts["pids"],
        cpus=opts["cpus"],
        disk=opts["disk"],
    )
    return (
        spec if tier == "auto" and opts["policy_file"] else spec.model_copy(update={"tier": tier})
    )


sandbox_options = budget_options("timeout", "memory", "pids", "cpus", "disk", "allow")
"""--policy, the process-tier budget options and --allow."""


def job_options(func: Any) -> Any:
    """The traits a job declares, shared by run and route."""
    for option in reversed(
        [
            click.option(
                "--tier",
                type=TierChoice(),
                default="auto",
                show_default=True,
                help="Tier to use; auto picks the cheapest that honours the job.",
            ),
            click.option(
                "--repo",
                type=click.Path(path_type=Path, file_okay=False, exists=True),
                help="Repository copied into the sandbox.",
            ),
            click.option("--image", help="Container image (default: the base image)."),
            click.option(
                "--python", "python_src", help="A Python snippet to run instead of a command."
            ),
            click.option("--processes", is_flag=True, help="The job spawns processes."),
            click.option("--network", is_flag=True, help="The job needs network."),
            click.option("--services", is_flag=True, help="The job needs running services."),
            click.option(
                "--repo-wide", is_flag=True, help="The job reads or writes across a repository."
            ),
            click.option(
                "--toolchain", help="A language toolchain the job needs (python, node, gcc, ...)."
            ),
            click.option(
                "--input-bytes", type=int, default=0, help="Total size of the job's inputs."
            ),
            click.option(
                "--untrusted",
                is_flag=True,
                help="Hostile or unreviewed code: needs the stronger boundary.",
            ),
        ]
    ):
        func = option(func)
    return sandbox_options(func)


def _job(command: tuple[str, ...], opts: dict[str, Any]) -> tuple[Any, Any]:
    from hybrid.router import Job

    spec = container_spec(opts)
    if not command and not opts["python_src"]:
        raise InvalidInput("give a command after -- (or --python CODE)")
    job = Job(
        command=list(command),
        python=opts["python_src"],
        repo=opts["repo"],
        image=opts["image"],
        needs_processes=opts["processes"],
        needs_network=opts["network"],
        needs_services=opts["services"],
        repo_wide=opts["repo_wide"],
        toolchain=opts["toolchain"],
        input_bytes=opts["input_bytes"],
        untrusted=opts["untrusted"],
        spec=spec,
    )
    return job, opts["tier"]


@click.command("run", context_settings={"ignore_unknown_options": True})
@job_options
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run_cmd(command: tuple[str, ...], as_json: bool, **opts: Any) -> None:
    """Run a command (or --python snippet) on the cheapest tier that honours it."""
    from hybrid import router, tiers

    job, tier = _job(command, opts)
    chosen = router.route(job, tier)
    picked: Any = chosen.tier
    if not as_json:
        click.echo(f"hybrid: running on {chosen.tier}", err=True)
    streamed = not as_json and tiers.get(chosen.tier).streams
    with reader_gone():
        result = router.run(job, picked, on_output=live_output if streamed else None)
    emit(
        {"route": chosen, "result": result},
        as_json,
        lambda: render_result(result, streamed),
    )
    raise click.exceptions.Exit(exit_code_for(result))


@click.command("route", context_settings={"ignore_unknown_options": True})
@job_options
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def route_cmd(command: tuple[str, ...], as_json: bool, **opts: Any) -> None:
    """Explain which tier would run a job, and why not the cheaper ones."""
    from hybrid import router

    job, tier = _job(command, opts)
    chosen = router.route(job, tier)

    def render() -> None:
        click.echo(f"tier: {chosen.tier}")
        for reason in chosen.reasons:
            click.echo(f"  because {reason}")
        for name, why in chosen.rejected.items():
            click.echo(f"  not {name}: {why}")

    emit(chosen, as_json, render)


@click.command("doctor")
@click.option("--deep", is_flag=True, help="Also start a hardened container per runtime.")
@json_option
def doctor_cmd(deep: bool, as_json: bool) -> None:
    """Which tiers this host can run; for each one it cannot, why and how to enable it."""
    from hybrid.workstation.doctor import probe

    statuses = probe(deep=deep)

    def render() -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(show_lines=False)
        table.add_column("tier")
        table.add_column("ok")
        table.add_column("detail / fix", overflow="fold")
        for status in statuses:
            text = status.detail if status.available else f"{status.detail}\nfix: {status.fix}"
            table.add_row(status.tier, "yes" if status.available else "no", text)
        Console(soft_wrap=False).print(table)

    emit(statuses, as_json, render)
