"""A project's dependencies in a workstation, with the network off inside.

detect (read the project's declarations, statically: regular files inside the repository only,
``files``; a direct reference, a VCS or path spec or an index option is refused, ``screen``) ->
lock (resolve and download on the host through the user's pip/npm configuration into a
content-addressed store) -> admit (the ``deps`` policy and every artifact's sha256, before
anything enters) -> install (a throwaway container with no network and the artifacts mounted
read-only, committed as a layer keyed by (image, manifest), reused by the next workstation of
the same project).

Installed files live under /opt/hybrid (a venv, node_modules), outside the workspace, so they
never appear in ``ws diff``; the project itself is put on ``sys.path`` from the workspace, so
its edits take effect without reinstalling.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from hybrid.deps.admission import admit, approved_set, enforce
from hybrid.deps.detect import detect
from hybrid.deps.layers import Layer, PruneReport, list_layers, prune, sizes
from hybrid.deps.models import Artifact, Declared, Manifest, Requirement, Target
from hybrid.deps.resolve import lock
from hybrid.errors import PolicyViolation, WorkstationNotFound
from hybrid.policy import SandboxSpec, check_input_path

if TYPE_CHECKING:
    from hybrid.workstation.base import Backend, Workstation

EVIDENCE = "deps.json"


class Installed(BaseModel):
    """What entered a workstation: the workstation's dependency evidence (``ws deps NAME``)."""

    workstation: str
    layer: str = Field(description="Image the workstation started from.")
    cache_hit: bool
    manifest: Manifest
    seconds: dict[str, float] = Field(
        default_factory=dict, description="Time per step: detect, lock, admit, install, create."
    )


class Prepared(BaseModel):
    """A project's admitted manifest and the layer that holds it installed."""

    manifest: Manifest
    layer: Layer
    seconds: dict[str, float] = Field(default_factory=dict)


def plan(
    repo: Path, spec: SandboxSpec | None = None, *, image: str | None = None, refresh: bool = False
) -> Manifest:
    """Detect and lock ``repo``'s dependencies for ``image`` and admit them (PolicyViolation)."""
    return _plan(repo, spec, image, refresh, {})


def _plan(
    repo: Path,
    spec: SandboxSpec | None,
    image: str | None,
    refresh: bool,
    seconds: dict[str, float],
) -> Manifest:
    from hybrid.deps.layers import target
    from hybrid.workstation.images import BASE_IMAGE

    check_input_path(repo, "repository")
    policy = (spec.deps if spec else None) or None
    groups = policy.groups if policy else ["test", "tests", "testing", "dev"]
    mark = time.monotonic()
    declared = detect(Path(repo), groups)
    found = target(image or BASE_IMAGE)
    seconds["detect"] = time.monotonic() - mark
    mark = time.monotonic()
    manifest = lock(
        Path(repo),
        declared,
        found,
        refresh=refresh,
        exclude_newer=policy.exclude_newer if policy else None,
    )
    seconds["lock"] = time.monotonic() - mark
    mark = time.monotonic()
    enforce(manifest, policy)
    seconds["admit"] = time.monotonic() - mark
    return manifest


def prepare(
    repo: Path, spec: SandboxSpec | None = None, *, image: str | None = None, refresh: bool = False
) -> Prepared:
    """Plan ``repo``'s dependencies and make (or reuse) the layer holding them installed."""
    from hybrid.deps.layers import ensure
    from hybrid.tiers.container import runtime_of
    from hybrid.workstation.images import BASE_IMAGE

    spec = spec or SandboxSpec(tier="docker")
    seconds: dict[str, float] = {}
    manifest = _plan(repo, spec, image, refresh, seconds)
    mark = time.monotonic()
    budget = spec.budget
    layer = ensure(
        manifest,
        image or BASE_IMAGE,
        runtime=runtime_of(spec.tier if spec.tier != "auto" else "docker"),
        memory=max(budget.memory, 2 * 1024**3),
        cpus=max(budget.cpus, 1.0),
        pids=max(budget.pids, 512),
    )
    seconds["install"] = time.monotonic() - mark
    return Prepared(manifest=manifest, layer=layer, seconds=seconds)


def up(
    backend: Backend,
    repo: Path,
    spec: SandboxSpec | None = None,
    *,
    image: str | None = None,
    name: str | None = None,
    persistent: bool = False,
    refresh: bool = False,
) -> Workstation:
    """A workstation holding ``repo`` with its admitted dependencies installed (network off)."""
    from hybrid.policy import for_workstation
    from hybrid.workstation import state

    spec = spec or for_workstation(SandboxSpec(tier="docker"))
    prepared = prepare(repo, spec, image=image, refresh=refresh)
    mark = time.monotonic()
    made = backend.create(
        spec, image=prepared.layer.ref, repo=repo, name=name, persistent=persistent
    )
    seconds = {**prepared.seconds, "create": time.monotonic() - mark}
    record = Installed(
        workstation=made.name,
        layer=prepared.layer.ref,
        cache_hit=prepared.layer.hit,
        manifest=prepared.manifest,
        seconds=seconds,
    )
    try:
        (state.directory("workstations", made.id) / EVIDENCE).write_text(record.model_dump_json())
    except BaseException:
        made.remove()
        raise
    return made


def installed(workstation: Workstation) -> Installed:
    """What entered ``workstation`` (WorkstationNotFound when it was made without --deps)."""
    from hybrid.deps.layers import LABEL_KEY, manifest_of
    from hybrid.workstation import state

    path = state.path("workstations", workstation.id) / EVIDENCE
    if path.is_file():
        return Installed.model_validate_json(path.read_text())
    # Started from a snapshot or fork of one: the layer's own record says what it holds.
    info = workstation.info()
    key = _image_label(info.image, LABEL_KEY)
    manifest = manifest_of(key) if key else None
    if manifest is None:
        raise WorkstationNotFound(
            f"{workstation.name} was made without --deps: no dependencies entered it"
        )
    return Installed(
        workstation=workstation.name, layer=info.image, cache_hit=True, manifest=manifest
    )


def _image_label(image: str, label: str) -> str | None:
    from hybrid.workstation.docker import client, translate

    with translate(f"inspect {image}"):
        try:
            labels: dict[str, Any] = client().api.inspect_image(image)["Config"].get("Labels") or {}
        except Exception:
            return None
    return labels.get(label)


__all__ = [
    "Artifact",
    "Declared",
    "Installed",
    "Layer",
    "Manifest",
    "PolicyViolation",
    "Prepared",
    "PruneReport",
    "Requirement",
    "Target",
    "admit",
    "approved_set",
    "detect",
    "enforce",
    "installed",
    "list_layers",
    "lock",
    "plan",
    "prepare",
    "prune",
    "sizes",
    "up",
]
_ = json
