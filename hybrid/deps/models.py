"""What a project declares, what a lock resolved it to, and the target it was resolved for."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Ecosystem = Literal["python", "node"]


class Target(BaseModel):
    """The interpreter and platform of a workstation image (what its wheels must match)."""

    model_config = ConfigDict(frozen=True)

    python: str = Field(description="major.minor of the image's python3, e.g. 3.11.")
    glibc: str = Field(description="The image's glibc version, e.g. 2.36 (empty: musl or none).")
    machine: str = Field(description="CPU architecture, e.g. x86_64.")
    npm: bool = Field(False, description="Whether the image has npm (a Node project can install).")


class Requirement(BaseModel):
    """One requirement the project declares, and where."""

    spec: str = Field(description="The requirement as written (PEP 508), e.g. pytest>=7.")
    source: str = Field(description="The file that declares it, relative to the repository.")
    pinned: bool = Field(description="Whether it names exactly one version (== or a lockfile).")


class Declared(BaseModel):
    """Everything a repository declares about its dependencies (detect())."""

    project: str | None = Field(None, description="The project's own distribution name.")
    python: list[Requirement] = Field(default_factory=list)
    locked: dict[str, str] = Field(
        default_factory=dict, description="name -> version pins from uv.lock / poetry.lock."
    )
    hashes: dict[str, list[str]] = Field(
        default_factory=dict, description="name==version -> sha256 digests a lockfile allows."
    )
    node: str | None = Field(
        None, description="The Node lockfile (package-lock.json / npm-shrinkwrap.json), if any."
    )
    paths: list[str] = Field(
        default_factory=list,
        description="Project source directories (relative) put on sys.path instead of installing it.",
    )
    version: str | None = Field(
        None,
        description="The release the checkout is at (its declared version, PKG-INFO, or its "
        "latest git tag): test tools resolve as if it were installed at that version.",
    )
    entry_points: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="group -> name -> object ('pkg.cli:main') the project declares: installed "
        "as its metadata, and console scripts as commands, as `pip install -e .` would.",
    )
    sources: list[str] = Field(default_factory=list, description="Every file that was read.")
    inputs: str = Field("", description="sha256 of every input read: a changed file changes it.")


class Artifact(BaseModel):
    """One file that enters the sandbox: pinned by name, version and sha256."""

    model_config = ConfigDict(frozen=True)

    ecosystem: Ecosystem
    name: str
    version: str
    filename: str
    sha256: str
    size: int


class Manifest(BaseModel):
    """Exactly what will enter a workstation, and from which declarations."""

    project: str | None = None
    target: Target
    artifacts: list[Artifact]
    requirements: list[Requirement] = Field(default_factory=list)
    node_lockfile: str | None = Field(None, description="Relative path of the Node lockfile.")
    paths: list[str] = Field(default_factory=list)
    version: str | None = Field(None, description="The project's release (Declared.version).")
    entry_points: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="The project's own entry points (Declared)."
    )
    exclude_newer: datetime | None = Field(
        None, description="What the project names was resolved as of this time (DepsPolicy)."
    )
    inputs: str = ""

    @property
    def total_bytes(self) -> int:
        return sum(a.size for a in self.artifacts)

    def digest(self) -> str:
        """sha256 over what decides the installed environment (artifacts, target, paths)."""
        body = {
            "target": self.target.model_dump(),
            "artifacts": sorted(
                (a.ecosystem, a.name, a.version, a.filename, a.sha256) for a in self.artifacts
            ),
            "paths": self.paths,
            "version": self.version,
            "node": self.node_lockfile,
            "entry_points": self.entry_points,
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
