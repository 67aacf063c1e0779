"""``hybrid deps`` and ``hybrid cache``: a project's dependencies, admitted and kept for reuse."""

from __future__ import annotations

import contextlib
import os
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hybrid.cli._options import exclude_newer_option, with_exclude_newer
from hybrid.cli._output import emit, json_option
from hybrid.errors import InvalidInput
from hybrid.paths import display

if TYPE_CHECKING:
    from hybrid.policy import SandboxSpec

_repo = click.argument(
    "repo", type=click.Path(path_type=Path, file_okay=False, exists=True), default="."
)
_policy = click.option(
    "--policy",
    "policy_file",
    type=click.Path(path_type=Path),
    help="SandboxSpec TOML whose [deps] table is the dependency policy.",
)
_approved = click.option(
    "--approved",
    type=click.Path(path_type=Path),
    help="Approved manifest (from `deps lock --output`): nothing outside it is admitted.",
)
_image = click.option("--image", help="Workstation image to resolve for (default: the base image).")


def _spec(policy_file: Path | None, approved: Path | None) -> SandboxSpec:
    from hybrid.policy import DepsPolicy, SandboxSpec, enforce

    spec = SandboxSpec.from_toml(policy_file) if policy_file else SandboxSpec(tier="docker")
    enforce(spec)
    if approved is not None:
        from hybrid.deps import approved_set

        approved_set(approved)  # a bad file is bad input now, not a violation later
        deps = spec.deps or DepsPolicy()
        spec = spec.model_copy(update={"deps": deps.model_copy(update={"approved": approved})})
    return spec


@click.group()
def deps() -> None:
    """A project's dependencies: detected, locked on the host, admitted before they enter."""


@deps.command("show")
@_repo
@json_option
def show(repo: Path, as_json: bool) -> None:
    """What REPO declares (requirements, lockfiles, test groups), read without running anything."""
    from hybrid.deps import detect
    from hybrid.policy import check_input_path

    check_input_path(repo, "repository")
    declared = detect(repo)

    def render() -> None:
        click.echo(
            f"project: {declared.project or '(none)'}  read: {', '.join(declared.sources) or 'nothing'}"
        )
        for req in declared.python:
            click.echo(f"  {req.spec}  ({req.source}{', pinned' if req.pinned else ''})")
        if declared.locked:
            click.echo(f"  {len(declared.locked)} pins from a lockfile")
        if declared.node:
            click.echo(f"  node: {declared.node}")

    emit(declared, as_json, render)


@deps.command("lock")
@_repo
@_image
@_policy
@_approved
@click.option("--refresh", is_flag=True, help="Resolve again even if the inputs are unchanged.")
@exclude_newer_option
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    help="Write the manifest (JSON) here, e.g. to approve it for later runs.",
)
@json_option
def lock_cmd(
    repo: Path,
    image: str | None,
    policy_file: Path | None,
    approved: Path | None,
    refresh: bool,
    exclude_newer: datetime | None,
    output: Path | None,
    as_json: bool,
) -> None:
    """Resolve and download REPO's dependencies on the host and admit them; print the manifest."""
    from hybrid.deps import plan

    spec = with_exclude_newer(_spec(policy_file, approved), exclude_newer)
    manifest = plan(repo, spec, image=image, refresh=refresh)
    if output is not None:
        _write(output, manifest.model_dump_json(indent=1))

    def render() -> None:
        _render_manifest(manifest)
        if output is not None:
            click.echo(f"wrote {display(output)}")

    emit(manifest, as_json, render)


@deps.command("admit")
@_repo
@_image
@_policy
@_approved
@click.option(
    "--manifest",
    "manifest_file",
    type=click.Path(path_type=Path),
    help="Admit this manifest file instead of locking REPO.",
)
@json_option
def admit_cmd(
    repo: Path,
    image: str | None,
    policy_file: Path | None,
    approved: Path | None,
    manifest_file: Path | None,
    as_json: bool,
) -> None:
    """Print every reason REPO's dependencies may not enter; exit 3 if there is any."""
    from pydantic import ValidationError

    from hybrid.deps import Manifest, admit, detect, lock
    from hybrid.deps.layers import target
    from hybrid.errors import PolicyError
    from hybrid.paths import read_input
    from hybrid.policy import DepsPolicy
    from hybrid.workstation.images import BASE_IMAGE

    spec = _spec(policy_file, approved)
    if manifest_file is not None:
        raw = read_input(manifest_file, "manifest", PolicyError)
        try:
            manifest = Manifest.model_validate_json(raw)
        except ValidationError:
            raise PolicyError(f"{display(manifest_file)}: not a dependency manifest") from None
    else:
        from hybrid.policy import check_input_path

        check_input_path(repo, "repository")
        policy = spec.deps or DepsPolicy()
        manifest = lock(
            repo,
            detect(repo, policy.groups),
            target(image or BASE_IMAGE),
            exclude_newer=policy.exclude_newer,
        )
    violations = admit(manifest, spec.deps)
    result = {
        "admitted": not violations,
        "violations": violations,
        "artifacts": len(manifest.artifacts),
        "bytes": manifest.total_bytes,
    }

    def render() -> None:
        if not violations:
            click.echo(
                f"admitted: {len(manifest.artifacts)} artifacts, {_size(manifest.total_bytes)}"
            )
            return
        click.echo(f"{len(violations)} violation(s)")
        for violation in violations:
            click.echo(f"  - {violation}")

    emit(result, as_json, render)
    if violations:
        raise click.exceptions.Exit(3)


def _render_manifest(manifest: object) -> None:
    from hybrid.deps import Manifest

    assert isinstance(manifest, Manifest)
    target = manifest.target
    click.echo(
        f"{len(manifest.artifacts)} artifacts, {_size(manifest.total_bytes)} for python "
        f"{target.python} / glibc {target.glibc} / {target.machine}; manifest {manifest.digest()[:16]}"
    )
    for artifact in manifest.artifacts:
        click.echo(
            f"  {artifact.name} {artifact.version}  {artifact.filename}  sha256:{artifact.sha256[:16]}"
        )


def _size(n: int) -> str:
    from hybrid.policy import human_size

    return human_size(n)


def _write(file: Path, text: str) -> None:
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, file)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise InvalidInput(f"{display(file)}: cannot write: {exc.strerror}") from None


@click.group()
def cache() -> None:
    """Dependency caches: the artifact store and the installed layers, with their sizes."""


@cache.command("ls")
@json_option
def cache_ls(as_json: bool) -> None:
    """Every installed dependency layer (least recently used first) and the store's size."""
    from hybrid.deps import sizes
    from hybrid.workstation.microvm.build import cache_usage

    found = sizes()
    vm = cache_usage()
    found["microvm"] = vm.model_dump()

    def render() -> None:
        click.echo(
            f"artifact store: {_size(found['store_bytes'])}  layers: {_size(found['layers_bytes'])}"
        )
        for layer in found["layers"]:
            used = (
                time.strftime("%Y-%m-%d %H:%M", time.localtime(layer["last_used"]))
                if layer["last_used"]
                else "never here (no record in this cache)"
            )
            click.echo(
                f"  {layer['ref']}  {layer['project'] or '-'}  {layer['artifacts']} artifacts  "
                f"{_size(layer['size_bytes'])}  used {used}"
            )
        click.echo(
            f"microvm: artifacts {_size(vm.current_bytes)}  templates {vm.templates} "
            f"({_size(vm.templates_bytes)})  stale {len(vm.stale)} ({_size(vm.stale_bytes)})"
        )

    emit(found, as_json, render)


@cache.command("prune")
@click.option(
    "--max-size",
    default="0",
    help="Keep the most recently used layers up to this size (e.g. 5G); default: remove every unused one.",
)
@json_option
def cache_prune(max_size: str, as_json: bool) -> None:
    """Evict least-recently-used layers (never one a workstation uses), unneeded artifacts,
    and microVM artifacts and templates nothing boots any more."""
    from hybrid.deps import prune
    from hybrid.policy import parse_size
    from hybrid.workstation.microvm.build import prune_cache

    try:
        cap = parse_size(max_size)
    except ValueError as exc:
        raise InvalidInput(f"--max-size: {exc}") from None
    report = prune(cap)
    vm = prune_cache()
    emit(
        {**report.model_dump(), "microvm": vm.model_dump()},
        as_json,
        lambda: click.echo(
            f"removed {len(report.layers)} layer(s), {_size(report.freed_bytes)}; "
            f"store freed {_size(report.store_freed_bytes)}; "
            f"microvm: {len(vm.stale)} stale artifact(s) and template(s), {_size(vm.stale_bytes)}"
        ),
    )
