"""Admission: every reason a manifest may not enter a workstation, before anything enters."""

from __future__ import annotations

import fnmatch
import json

from packaging.utils import canonicalize_name
from pydantic import ValidationError

from hybrid.deps import store
from hybrid.deps.models import Artifact, Manifest
from hybrid.errors import PolicyError, PolicyViolation
from hybrid.paths import display, read_input
from hybrid.policy import DepsPolicy, human_size


def approved_set(path: object) -> set[tuple[str, str, str]]:
    """(name, version, sha256) of every artifact in an approved-manifest file."""
    from pathlib import Path

    raw = read_input(Path(str(path)), "approved manifest", PolicyError)
    try:
        data = json.loads(raw)
        rows = data["artifacts"] if isinstance(data, dict) else data
        artifacts = [Artifact.model_validate(row) for row in rows]
    except (ValueError, KeyError, TypeError, ValidationError):
        raise PolicyError(
            f"{display(str(path))}: not a dependency manifest (write one with: hybrid deps lock --output FILE)"
        ) from None
    return {(canonicalize_name(a.name), a.version, a.sha256) for a in artifacts}


def admit(manifest: Manifest, policy: DepsPolicy | None = None) -> list[str]:
    """Every violation of ``policy`` by ``manifest`` (and every stored file that fails its pin)."""
    policy = policy or DepsPolicy()
    violations: list[str] = []
    approved = approved_set(policy.approved) if policy.approved is not None else None
    for artifact in manifest.artifacts:
        if artifact.version == "" and artifact.ecosystem == "node":
            continue  # package.json and its lockfile: the project's own files
        name = canonicalize_name(artifact.name) if artifact.ecosystem == "python" else artifact.name
        shown = f"deps: {artifact.name} {artifact.version}"
        denied = next((p for p in policy.deny if _match(name, p)), None)
        if denied:
            violations.append(f"{shown} is denied (deps.deny {denied!r})")
        if policy.allow and not any(_match(name, p) for p in policy.allow):
            violations.append(f"{shown} is not on the allow-list (deps.allow)")
        if approved is not None and (name, artifact.version, artifact.sha256) not in approved:
            violations.append(
                f"{shown} (sha256 {artifact.sha256[:16]}...) is not in the approved manifest "
                f"{display(str(policy.approved))}"
            )
    if policy.require_pins:
        for req in manifest.requirements:
            if not req.pinned:
                violations.append(
                    f"deps: {req.spec!r} in {req.source} is not pinned to one version "
                    "(deps.require_pins; pin it with == or add a lockfile)"
                )
    if manifest.total_bytes > policy.max_bytes:
        violations.append(
            f"deps: {human_size(manifest.total_bytes)} of artifacts is over deps.max_bytes "
            f"({human_size(policy.max_bytes)})"
        )
    violations += store.problems(manifest.artifacts)
    return violations


def enforce(manifest: Manifest, policy: DepsPolicy | None = None) -> Manifest:
    """``manifest`` if admitted, else PolicyViolation with every reason."""
    violations = admit(manifest, policy)
    if violations:
        raise PolicyViolation(violations)
    return manifest


def _match(name: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(
        name, canonicalize_name(pattern) if "*" not in pattern else pattern.lower()
    )
