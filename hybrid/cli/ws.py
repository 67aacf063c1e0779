"""``hybrid ws``: long-lived workstations (Docker with runc, or gVisor) holding a repository copy."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from hybrid.cli._options import TierChoice, name_values
from hybrid.cli._output import (
    emit,
    exit_code_for,
    json_option,
    live_output,
    reader_gone,
    render_result,
)
from hybrid.cli._progress import status
from hybrid.cli.tiers import container_spec, sandbox_options
from hybrid.errors import EngineUnavailable, InvalidInput, PolicyViolation, WorkstationNotFound
from hybrid.workstation.base import (
    Backend,
    GcReport,
    Snapshots,
    Workstation,
    snapshots_of,
    snapshotting,
)

if TYPE_CHECKING:
    from hybrid.policy import SandboxSpec

T = TypeVar("T")


def _backend(tier: str = "docker") -> Backend:
    from hybrid.workstation import backend

    return backend(tier)


def _open(name: str) -> Workstation:
    from hybrid.workstation import locate

    return locate(name)


def _each(ask: Callable[[Backend], T]) -> list[T]:
    """``ask`` of every workstation backend; one whose engine is down is passed over (with a
    line on stderr) unless every one is."""
    from hybrid.workstation import backends

    answers: list[T] = []
    down: list[EngineUnavailable] = []
    for backend in backends():
        try:
            answers.append(ask(backend))
        except EngineUnavailable as exc:
            down.append(exc)
    if down and not answers:
        raise down[0]
    for reason in down:
        click.echo(f"hybrid: skipped: {reason}", err=True)
    return answers


@click.group()
def ws() -> None:
    """Long-lived workstations: a repository copy, its toolchain, state between commands."""


@ws.command("up")
@click.argument("name", required=False)
@click.option(
    "--repo",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="Repository to copy in.",
)
@click.option("--image", help="Image to start from (default: the base image).")
@click.option(
    "--from", "snapshot", help="Snapshot to start from (its files and installed packages)."
)
@click.option(
    "--tier",
    type=TierChoice(auto=False),
    help="The tier to run it in (default docker; one that keeps workstations).",
)
@click.option("--gvisor", is_flag=True, help="Same as --tier gvisor.")
@click.option(
    "--deps",
    "with_deps",
    is_flag=True,
    help="Install the repository's dependencies (locked on the host, admitted by the policy's "
    "[deps], installed with the network off; reused while the lockfile is unchanged).",
)
@click.option(
    "--service",
    "service_kinds",
    multiple=True,
    metavar="KIND[:VERSION]",
    help="Start a service with it: postgres or redis (repeatable; [[services]] in a policy says more).",
)
@click.option(
    "--allow-env",
    "allow_env",
    multiple=True,
    metavar="NAME",
    help="Let `ws exec -e NAME=VALUE` set NAME (repeatable; adds it to env.allow).",
)
@sandbox_options
@json_option
def up(
    name: str | None,
    repo: Path | None,
    image: str | None,
    snapshot: str | None,
    tier: str | None,
    gvisor: bool,
    with_deps: bool,
    service_kinds: tuple[str, ...],
    allow_env: tuple[str, ...],
    as_json: bool,
    **opts: Any,
) -> None:
    """Start a workstation (it stays until `ws down`)."""
    if gvisor and tier not in (None, "gvisor"):
        raise InvalidInput(f"--gvisor contradicts --tier {tier}")
    chosen = "gvisor" if gvisor else tier
    spec = container_spec(opts, chosen or "docker", workstation=True)
    if with_deps and (repo is None or snapshot):
        raise InvalidInput("--deps installs a repository's dependencies: give --repo (not --from)")
    if service_kinds:
        if snapshot:
            raise InvalidInput("--from starts the snapshot's own services; drop --service")
        spec = _with_services(spec, service_kinds)
    if allow_env:
        allowed = [*spec.env.allow, *(n for n in allow_env if n not in spec.env.allow)]
        spec = spec.model_copy(update={"env": spec.env.model_copy(update={"allow": allowed})})
        opts["allow_env"] = allow_env
    backend = _backend(chosen or "docker")
    text = f"starting a {spec.tier} workstation" + (f" with a copy of {repo}" if repo else "")
    with status(live=not as_json, text=text):
        if with_deps and repo is not None:
            from hybrid import deps

            made = deps.up(backend, repo, spec, image=image, name=name, persistent=True)
        else:
            made = _up(backend, name, repo, image, snapshot, chosen is not None, spec, opts)
    info = made.info()
    emit(info, as_json, lambda: click.echo(info.name))


def _with_services(spec: SandboxSpec, kinds: tuple[str, ...]) -> SandboxSpec:
    from hybrid.errors import PolicyError
    from hybrid.policy import Service

    added = []
    for item in kinds:
        kind, _, version = item.partition(":")
        if kind not in ("postgres", "redis"):
            raise PolicyError(
                f"--service {item!r}: use postgres or redis (other images: [[services]] in a policy)"
            )
        added.append(Service(kind=kind, version=version or None))
    return spec.model_copy(update={"services": [*spec.services, *added]})


def _up(
    backend: Backend,
    name: str | None,
    repo: Path | None,
    image: str | None,
    snapshot: str | None,
    tier_given: bool,
    spec: SandboxSpec,
    opts: dict[str, Any],
) -> Workstation:
    if snapshot:
        if image or repo:
            raise InvalidInput(
                "--from starts from a snapshot; it cannot be combined with --image or --repo"
            )
        given = (
            opts["policy_file"]
            or any(opts[k] is not None for k in ("timeout", "memory", "pids", "cpus", "disk"))
            or opts["allow"]
            or opts.get("allow_env")
            or tier_given
        )
        return snapshots_of(backend).start(
            snapshot, spec=spec if given else None, name=name, persistent=True
        )
    return backend.create(spec, image=image, repo=repo, name=name, persistent=True)


@ws.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option(
    "--timeout", type=float, help="Deadline in seconds (default: the workstation's budget)."
)
@click.option("--workdir", "-w", help="Working directory inside (default: the workspace).")
@click.option(
    "--env",
    "-e",
    "env",
    multiple=True,
    help="NAME=VALUE (NAME must be allowed: `ws up --allow-env NAME` or env.allow).",
)
@json_option
def exec_(
    name: str,
    command: tuple[str, ...],
    timeout: float | None,
    workdir: str | None,
    env: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run a command in a workstation; its output streams live, its exit code is ours."""
    variables = name_values(env, "--env")
    workstation = _open(name)
    refused = sorted(set(variables) - set(workstation.spec.env.allow))
    if refused:
        flags = " ".join(f"--allow-env {n}" for n in refused)
        raise PolicyViolation(
            [
                f"env: {', '.join(refused)} not on {name}'s allow-list (env.allow); "
                f"allow it when starting the workstation: hybrid ws up NAME {flags}"
            ]
        )
    argv: str | list[str] = command[0] if len(command) == 1 and " " in command[0] else list(command)
    with reader_gone():
        result = workstation.exec(
            argv,
            timeout=timeout,
            env=variables or None,
            workdir=workdir,
            on_output=None if as_json else live_output,
        )
    emit(result, as_json, lambda: render_result(result, streamed=True))
    raise click.exceptions.Exit(exit_code_for(result))


@ws.command("deps")
@click.argument("name")
@json_option
def deps_cmd(name: str, as_json: bool) -> None:
    """What entered a workstation made with --deps: every artifact, pinned, and the layer."""
    from hybrid import deps

    record = deps.installed(_open(name))

    def render() -> None:
        manifest = record.manifest
        hit = "reused" if record.cache_hit else "built"
        click.echo(
            f"{record.workstation}: {len(manifest.artifacts)} artifacts from {record.layer} ({hit})"
        )
        for artifact in manifest.artifacts:
            click.echo(f"  {artifact.name} {artifact.version}  sha256:{artifact.sha256}")

    emit(record, as_json, render)


@ws.command("shell")
@click.argument("name")
@click.option(
    "--shell", "program", default="/bin/bash", show_default=True, help="Program to start."
)
@json_option
def shell(name: str, program: str, as_json: bool) -> None:
    """Attach a person to a running workstation (an interactive shell, same user and limits).

    With --json, print the attach command instead of running it (for a terminal or tool to run):
    the policy's variables appear by name in "env", their values never.
    """
    workstation = _open(name)
    # -t only with a terminal: piped input (a script, a test) still reaches the shell.
    attach = workstation.attach_command(program, tty=sys.stdin.isatty() or as_json)
    if as_json:
        # Variables appear by name only: whoever runs the argv supplies their values.
        shown = {"name": name, "container": workstation.id, "argv": attach.argv}
        emit({**shown, "env": sorted(attach.env)}, True, lambda: None)
        return
    sys.stdout.flush()
    os.execve(attach.argv[0], attach.argv, {**os.environ, **attach.env})


@ws.command("cp")
@click.argument("source")
@click.argument("dest")
@json_option
def cp(source: str, dest: str, as_json: bool) -> None:
    """Copy files in or out: `ws cp FILE NAME:PATH` or `ws cp NAME:PATH DIR`."""
    inside_src, inside_dest = _split(source), _split(dest)
    if (inside_src is None) == (inside_dest is None):
        raise InvalidInput("exactly one side must be NAME:PATH (a workstation path)")
    if inside_dest is not None:
        name, path = inside_dest
        if not Path(source).exists():
            raise InvalidInput(f"{source}: no such file or directory")
        workstation = _open(name)
        target = path if not path.endswith("/") else path + Path(source).name
        workstation.put(Path(source), target)
        summary = {"copied": source, "to": f"{name}:{target}"}
    else:
        assert inside_src is not None
        name, path = inside_src
        _open(name).get(path, Path(dest))
        summary = {"copied": f"{name}:{path}", "to": dest}
    emit(summary, as_json, lambda: click.echo(f"{summary['copied']} -> {summary['to']}", err=True))


def _split(value: str) -> tuple[str, str] | None:
    name, sep, path = value.partition(":")
    if not sep or "/" in name or not name:
        return None
    return name, path


@ws.command("diff")
@click.argument("name")
@click.option(
    "--output", "-o", type=click.Path(path_type=Path, dir_okay=False), help="Write the patch here."
)
@json_option
def diff(name: str, output: Path | None, as_json: bool) -> None:
    """The agent's changes as a unified diff (apply with `git apply`)."""
    patch = _open(name).diff()
    # Files in other encodings come back as surrogate escapes: write the original bytes.
    raw = patch.encode("utf-8", errors="surrogateescape")
    if output is not None:
        output.write_bytes(raw)

    def render() -> None:
        if output is None:
            sys.stdout.flush()
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()

    emit({"name": name, "diff": raw.decode("utf-8", errors="replace")}, as_json, render)


@ws.command("snapshot")
@click.argument("name")
@click.argument("snapshot")
@json_option
def snapshot(name: str, snapshot: str, as_json: bool) -> None:
    """Commit a workstation (files, installed packages) as SNAPSHOT; start from it with `ws up --from`."""
    with status(live=not as_json, text=f"committing {name} as {snapshot}"):
        info = snapshotting(_open(name)).snapshot(snapshot)
    emit(info, as_json, lambda: click.echo(info.name))


@ws.command("fork")
@click.argument("name")
@click.argument("count", type=click.IntRange(1, 64))
@json_option
def fork(name: str, count: int, as_json: bool) -> None:
    """Start COUNT copies of a workstation's current state, for parallel attempts."""
    with status(live=not as_json, text=f"forking {name} into {count}"):
        forks = snapshotting(_open(name)).fork(count)
    infos = [f.info() for f in forks]
    emit(infos, as_json, lambda: click.echo("\n".join(i.name for i in infos)))


@ws.command("ls")
@json_option
def ls(as_json: bool) -> None:
    """Workstations and snapshots on this engine."""
    workstations = [w for part in _each(lambda b: b.list()) for w in part]
    snapshots = [
        s
        for part in _each(lambda b: b.snapshots() if isinstance(b, Snapshots) else [])
        for s in part
    ]

    def render() -> None:
        from rich.table import Table

        table = Table(title="workstations")
        columns = ("name", "tier", "status", "image", "kept", "from snapshot", "egress", "services")
        for column in columns:
            table.add_column(column, no_wrap=True)
        for w in workstations:
            table.add_row(
                w.name,
                w.tier,
                w.status,
                w.image,
                "yes" if w.persistent else "no",
                w.snapshot_of or "",
                "" if w.egress_events is None else f"{w.egress_events} requests",
                ", ".join(f"{s.name}:{s.port} {s.status}" for s in w.services),
            )
        tables = [table]
        if snapshots:
            snaps = Table(title="snapshots")
            for column in ("name", "source", "image", "created"):
                snaps.add_column(column, no_wrap=True)
            for s in snapshots:
                snaps.add_row(s.name, s.source, s.image, s.created[:19])
            tables.append(snaps)
        _print_whole(tables)

    emit({"workstations": workstations, "snapshots": snapshots}, as_json, render)


def _print_whole(tables: list[Any]) -> None:
    """Print rich tables at their natural width: names the next command needs are never cut or
    folded to fit a narrow terminal or the 80 columns of a pipe (long lines wrap instead)."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console()
    unbounded = console.options.update_width(100_000)
    width = max(Measurement.get(console, unbounded, t).maximum for t in tables)
    wide = Console(width=max(console.width, width))
    for table in tables:
        wide.print(table)


@ws.command("egress")
@click.argument("name")
@json_option
def egress(name: str, as_json: bool) -> None:
    """Every request a workstation made through its egress proxy: allowed, refused, failed."""
    events = _open(name).egress_log()

    def render() -> None:
        if not events:
            click.echo(f"{name}: no requests yet", err=True)
            return
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"egress of {name}")
        for column in ("time", "decision", "method", "target", "address", "reason"):
            table.add_column(column)
        colour = {"allow": "green", "deny": "red", "error": "yellow"}
        for e in events:
            # Text, not markup: host and reason are the workstation's to choose.
            table.add_row(
                e.time.strftime("%Y-%m-%d %H:%M:%S"),
                Text(e.decision, style=colour[e.decision]),
                Text(e.method),
                Text(f"{e.host}:{e.port}"),
                Text(e.address),
                Text(e.reason),
            )
        Console().print(table)

    emit(events, as_json, render)


@ws.command("down")
@click.argument("names", nargs=-1)
@click.option(
    "--snapshot", "snapshots", multiple=True, help="Also delete this snapshot (repeatable)."
)
@json_option
def down(names: tuple[str, ...], snapshots: tuple[str, ...], as_json: bool) -> None:
    """Remove workstations (and their workspaces), and snapshots named with --snapshot."""
    if not names and not snapshots:
        raise InvalidInput("name a workstation (or --snapshot NAME)")
    for name in names:
        _open(name).remove()
    for snap in snapshots:
        _remove_snapshot(snap)
    summary = {"removed": list(names), "snapshots": list(snapshots)}
    emit(
        summary,
        as_json,
        lambda: click.echo(f"removed {', '.join([*names, *snapshots])}", err=True),
    )


@ws.command("gc")
@click.option(
    "--all", "everything", is_flag=True, help="Also remove kept workstations and every snapshot."
)
@json_option
def gc(everything: bool, as_json: bool) -> None:
    """Remove what crashed clients left behind (containers, volumes, fork snapshots)."""
    report = GcReport()
    for part in _each(lambda b: b.gc(everything)):
        report.containers += part.containers
        report.volumes += part.volumes
        report.networks += part.networks
        report.images += part.images

    def render() -> None:
        total = len(report.containers) + len(report.volumes) + len(report.images)
        click.echo(
            f"removed {len(report.containers)} containers, {len(report.volumes)} volumes, "
            f"{len(report.images)} images" + ("" if total else " (nothing to do)"),
            err=True,
        )

    emit(report, as_json, render)


def _remove_snapshot(name: str) -> None:
    """Remove snapshot ``name`` from whichever backend holds it."""
    from hybrid.workstation import backends

    holders = [b for b in backends() if isinstance(b, Snapshots)]
    if not holders:
        snapshots_of(_backend())  # raises: no backend keeps snapshots
    for backend in holders:
        with contextlib.suppress(WorkstationNotFound):
            backend.remove_snapshot(name)
            return
    raise WorkstationNotFound(f"no snapshot named {name}")
