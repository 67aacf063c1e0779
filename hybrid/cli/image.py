"""``hybrid image``: workstation images built here, with no registry."""

from __future__ import annotations

import click

from hybrid.cli._output import emit, json_option
from hybrid.errors import WorkstationNotFound


@click.group()
def image() -> None:
    """Workstation images built here (no registry needed)."""


@image.command("bootstrap")
@click.option(
    "--tag",
    help="Image tag to build (default: hybrid/base:bookworm or $HYBRID_BASE_IMAGE; "
    "hybrid/base:SUITE for another --suite).",
)
@click.option(
    "--mirror", help="Debian mirror URI (default: the one in this machine's apt sources)."
)
@click.option(
    "--suite",
    help="Debian suite (default: this machine's release); trixie has Python 3.13, forky 3.14.",
)
@click.option("--force", is_flag=True, help="Rebuild even if the image exists.")
@click.option(
    "--profile",
    type=click.Choice(["python", "node", "build"]),
    default="python",
    show_default=True,
    help="Package set: python (the base), node (+ nodejs, npm), build (+ compilers, headers).",
)
@click.option(
    "--service",
    "service",
    metavar="KIND[:VERSION]",
    help="Build a service image instead (postgres, redis) from the base image and Debian packages.",
)
@json_option
def bootstrap(
    tag: str | None,
    mirror: str | None,
    suite: str | None,
    force: bool,
    profile: str,
    service: str | None,
    as_json: bool,
) -> None:
    """Build the base image (Debian minbase + python3, pytest, git) with debootstrap and import it."""
    from rich.console import Console

    from hybrid.workstation import images

    tag = tag or images.profile_tag(profile, suite)
    if service:
        kind, _, version = service.partition(":")
        tag = f"{kind} service image"
    console = Console(stderr=True)
    with console.status(f"building {tag}", spinner="dots") as status:

        def progress(line: str) -> None:
            if not as_json:
                status.update(f"building {tag}: {line[:100]}")

        if service:
            from hybrid.workstation.services import bootstrap_service

            info = bootstrap_service(
                kind, version or None, mirror=mirror, suite=suite, force=force, on_progress=progress
            )
        else:
            info = images.bootstrap(
                tag,
                mirror=mirror,
                suite=suite,
                force=force,
                packages=images.PROFILES[profile],
                on_progress=progress,
            )
    emit(
        info,
        as_json,
        lambda: click.echo(
            f"{info.tag} {'built' if info.built else 'present'} ({info.size_bytes // 1024**2} MB)"
        ),
    )


@image.command("show")
@click.option("--tag", help="Image tag (default: the base image).")
@json_option
def show(tag: str | None, as_json: bool) -> None:
    """Whether the base image (or --tag) is present on the engine."""
    from hybrid.workstation import images

    tag = tag or images.BASE_IMAGE
    info = images.get(tag)
    if info is None:
        raise WorkstationNotFound(f"no image {tag} (build it with: hybrid image bootstrap)")
    emit(
        info,
        as_json,
        lambda: click.echo(f"{info.tag} {info.id[7:19]} {info.size_bytes // 1024**2} MB"),
    )


@image.command("microvm")
@click.option("--tag", help="Image the root filesystem comes from (default: the base image).")
@json_option
def microvm(tag: str | None, as_json: bool) -> None:
    """Build the microvm tier's kernel, initramfs and root filesystem (cached by their inputs)."""
    from hybrid.workstation.microvm import build

    made = build.build(
        tag, on_progress=None if as_json else lambda line: click.echo(line, err=True)
    )
    emit(made, as_json, lambda: click.echo(f"microvm artifacts {made.key} ({made.kernel_package})"))
