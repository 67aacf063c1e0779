"""The one reviewable statement of what a job may do, and ``admit()`` which checks it.

A ``SandboxSpec`` loads from and dumps to TOML. Every tier maps the same spec onto its own
mechanism (fuel and store limits for WebAssembly, cgroups and namespaces for containers).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from hybrid.errors import PolicyError, PolicyViolation
from hybrid.paths import read_input

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(value: int | str) -> int:
    """Parse a byte size: an int, or a string like ``512``, ``64k``, ``256M``, ``1GiB`` (powers of 1024)."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative: {value}")
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"not a size: {value!r} (use e.g. 512k, 256M, 1G)")
    number, unit, _ = match.groups()
    return int(float(number) * 1024 ** _POWERS[unit.lower()])


def human_size(n: int) -> str:
    """A byte count for messages: exact units when they fit, else one decimal (``23.5G``)."""
    for unit, power in (("T", 4), ("G", 3), ("M", 2), ("K", 1)):
        if n >= 1024**power:
            value = n / 1024**power
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return str(n)


def format_size(n: int) -> str:
    """Format a byte count the way parse_size reads it back (``256M``)."""
    for unit, power in (("T", 4), ("G", 3), ("M", 2), ("K", 1)):
        if n and n % 1024**power == 0:
            return f"{n // 1024**power}{unit}"
    return str(n)


Size = Annotated[int, BeforeValidator(parse_size)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Budget(_Strict):
    """Hard limits for one run."""

    wall_seconds: float = Field(30.0, gt=0, description="Wall-clock deadline in seconds.")
    memory: Size = Field(256 * 1024**2, gt=0, description="Memory cap in bytes (accepts 256M, 1G).")
    fuel: int = Field(2_000_000_000, gt=0, description="WebAssembly fuel (roughly instructions).")
    pids: int = Field(64, gt=0, description="Maximum processes and threads (process tiers).")
    cpus: float = Field(1.0, gt=0, description="CPU share in cores (process tiers).")
    output_bytes: Size = Field(
        1024**2, gt=0, description="Bytes kept of each of stdout and stderr."
    )
    disk: Size | None = Field(
        None,
        gt=0,
        description=(
            "Bytes the writable area may hold (accepts 64M, 2G); unset means the tier's default: "
            "2 GiB for a process tier's workspace, 64 MiB for a WASM scratch directory."
        ),
    )

    def disk_for(self, tier: str) -> int:
        """The disk cap in bytes on ``tier``: ``disk`` when set, else the tier's default."""
        if self.disk is not None:
            return self.disk
        return DEFAULT_WASM_DISK if tier in ("wasm", "python-wasm") else DEFAULT_DISK


DEFAULT_DISK = 2 * 1024**3
"""Workspace cap of a process tier (docker, gvisor) when ``Budget.disk`` is unset."""

DEFAULT_WASM_DISK = 64 * 1024**2
"""Scratch-directory cap of the WASM tiers when ``Budget.disk`` is unset."""


class Mount(_Strict):
    """A host path made visible inside the sandbox."""

    source: Path = Field(description="Host path.")
    target: str = Field(description="Absolute path inside the sandbox.")
    mode: Literal["ro", "rw"] = Field("ro", description="Read-only (default) or read-write.")

    @field_validator("target")
    @classmethod
    def _absolute(cls, value: str) -> str:
        path = PurePosixPath(value)
        if not path.is_absolute() or ".." in path.parts:
            raise ValueError(f"mount target must be an absolute path without '..': {value!r}")
        return str(path)


class NetworkPolicy(_Strict):
    """Network access. The default is none at all."""

    mode: Literal["none", "egress"] = Field(
        "none", description="none, or egress to the allow-list only."
    )
    allow: list[str] = Field(
        default_factory=list, description="host[:port] patterns reachable in egress mode."
    )


class Environment(_Strict):
    """The environment a job sees: nothing from the host unless named here."""

    allow: list[str] = Field(
        default_factory=list, description="Names that may be set or inherited."
    )
    set: dict[str, str] = Field(default_factory=dict, description="Variables set to these values.")
    inherit: list[str] = Field(default_factory=list, description="Variables copied from the host.")

    def resolve(self) -> dict[str, str]:
        """The concrete environment: ``set`` plus the inherited host values that exist."""
        env = {name: os.environ[name] for name in self.inherit if name in os.environ}
        env.update(self.set)
        return env


Tier = Literal["auto", "wasm", "python-wasm", "docker", "gvisor"]


class SandboxSpec(_Strict):
    """What a job may do, on any tier."""

    tier: Tier = Field("auto", description="The tier to run on; auto lets the router choose.")
    budget: Budget = Field(default_factory=Budget)
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    mounts: list[Mount] = Field(default_factory=list)
    workspace: str = Field("/workspace", description="The one writable area inside the sandbox.")
    env: Environment = Field(default_factory=Environment)

    @classmethod
    def from_toml(cls, path: str | Path) -> SandboxSpec:
        """Load a spec from a TOML file; any problem raises PolicyError with the field at fault."""
        path = Path(path)
        raw = read_input(path, "policy file", PolicyError)
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise PolicyError(f"{path}: not UTF-8 text") from None
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"{path}: not valid TOML: {exc}") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "policy") -> SandboxSpec:
        """Validate a spec from plain data; errors name the field at fault."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top level)"
            more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
            raise PolicyError(f"{source}: {where}: {first['msg']}{more}") from None

    def to_toml(self) -> str:
        """Dump as TOML that from_toml reads back to an equal spec."""
        data = self.model_dump(mode="json")
        for key in ("memory", "output_bytes"):
            data["budget"][key] = format_size(data["budget"][key])
        if data["budget"]["disk"] is None:
            del data["budget"]["disk"]  # TOML has no null: unset means the tier's default
        else:
            data["budget"]["disk"] = format_size(data["budget"]["disk"])
        return tomli_w.dumps(data)


@dataclass(frozen=True)
class TierLimits:
    """The largest budget a tier can honour on this host."""

    wall_seconds: float
    memory: int
    fuel: int | None
    pids: int | None
    cpus: float
    output_bytes: int
    network: bool
    disk: int


def _host_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 4 * 1024**3


@functools.cache
def _host_disk() -> int:
    # The workspace images are sparse files on the filesystem that holds the home directory
    # (where the state directory is): a cap beyond its size could never be honoured.
    try:
        stat = os.statvfs(os.path.expanduser("~"))
        return stat.f_frsize * stat.f_blocks
    except OSError:
        return 64 * 1024**3


WASM_DISK_MAX = 1024**3
"""The largest WASM scratch cap: the scratch is a RAM-backed tmpfs where mounting is possible."""


def tier_limits(tier: str) -> TierLimits:
    """Maximum budgets for a tier on this host (wasm32 caps memory at 4 GiB)."""
    cpus = float(os.cpu_count() or 1)
    if tier in ("wasm", "python-wasm"):
        return TierLimits(600, 4 * 1024**3, 10**13, None, 1.0, 64 * 1024**2, False, WASM_DISK_MAX)
    if tier in ("docker", "gvisor"):
        return TierLimits(
            24 * 3600, _host_memory(), None, 32768, cpus, 64 * 1024**2, True, _host_disk()
        )
    raise PolicyError(f"unknown tier {tier!r} (use wasm, python-wasm, docker or gvisor)")


TIERS = ("wasm", "python-wasm", "docker", "gvisor")

# Host paths that hold credentials or control of the host. Mounting one, or a directory that
# contains one, hands the job ambient authority.
SECRET_PATHS = (
    "~/.ssh",
    "~/.aws",
    "~/.azure",
    "~/.config/gcloud",
    "~/.kube",
    "~/.docker",
    "~/.gnupg",
    "~/.netrc",
    "~/.git-credentials",
    "~/.config/gh",
    "~/.pypirc",
    "~/.npmrc",
    "/root/.ssh",
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/sudoers",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd",
    "/proc",
    "/sys",
)

# Variable names that carry credentials: never inherited from the host, even when allow-listed.
SECRET_ENV = (
    "*TOKEN*",
    "*SECRET*",
    "*PASSWORD*",
    "*PASSWD*",
    "*CREDENTIAL*",
    "*_KEY",
    "*API_KEY*",
    "AWS_*",
    "SSH_AUTH_SOCK",
)


def _secret_paths() -> list[Path]:
    return _secret_paths_for(os.path.expanduser("~"))


@functools.lru_cache(maxsize=4)
def _secret_paths_for(home: str) -> list[Path]:
    # Cached per home directory: resolving ~20 paths costs ~0.25 ms, as much as a small wasm run.
    paths = []
    for raw in SECRET_PATHS:
        path = Path(os.path.expanduser(raw))
        paths.append(Path(os.path.normpath(path.absolute())))
        if path.exists():
            paths.append(path.resolve())
    return paths


def _within(path: PurePosixPath | Path, root: PurePosixPath | Path) -> bool:
    return path == root or root in path.parents


def admit(spec: SandboxSpec, tier: str | None = None) -> list[str]:
    """Every reason ``spec`` may not run (on ``tier``, default the spec's own); empty means admitted."""
    violations: list[str] = []
    tier = tier or spec.tier
    tiers = TIERS if tier == "auto" else (tier,)
    limits = [tier_limits(t) for t in tiers]

    if spec.network.mode == "egress":
        if not spec.network.allow:
            violations.append(
                'network: egress without an allow-list; name the hosts in network.allow or use mode = "none"'
            )
        if not any(lim.network for lim in limits):
            violations.append(
                f'network: the {tier} tier has no network; use mode = "none" or a container tier'
            )

    workspace = PurePosixPath(spec.workspace)
    if not workspace.is_absolute() or workspace == PurePosixPath("/"):
        violations.append(
            f"workspace: must be an absolute directory other than /, got {spec.workspace!r}"
        )
    secrets = _secret_paths() if spec.mounts else []
    for i, mount in enumerate(spec.mounts):
        where = f"mounts[{i}] {mount.source} -> {mount.target}"
        if mount.mode == "rw" and not _within(PurePosixPath(mount.target), workspace):
            violations.append(
                f"{where}: writable mount outside the workspace {spec.workspace}; mount it read-only or under the workspace"
            )
        source = Path(os.path.normpath(mount.source.expanduser().absolute()))
        resolved = mount.source.expanduser().resolve()
        for secret in secrets:
            if any(_within(s, secret) or _within(secret, s) for s in (source, resolved)):
                violations.append(
                    f"{where}: exposes the host secret path {secret}; mount a narrower directory"
                )
                break

    for name in sorted(set(spec.env.set) | set(spec.env.inherit)):
        if name not in spec.env.allow:
            violations.append(f"env: {name} is not on the allow-list (env.allow)")
    for name in spec.env.inherit:
        if any(fnmatch.fnmatchcase(name.upper(), pat) for pat in SECRET_ENV):
            violations.append(
                f"env: {name} looks like a credential; host credentials are never inherited (set a scoped value in env.set)"
            )

    budget = spec.budget
    checks = (
        ("wall_seconds", budget.wall_seconds, [lim.wall_seconds for lim in limits]),
        ("memory", budget.memory, [lim.memory for lim in limits]),
        ("fuel", budget.fuel, [lim.fuel for lim in limits]),
        ("pids", budget.pids, [lim.pids for lim in limits]),
        ("cpus", budget.cpus, [lim.cpus for lim in limits]),
        ("output_bytes", budget.output_bytes, [lim.output_bytes for lim in limits]),
        ("disk", budget.disk, [lim.disk for lim in limits]),
    )
    for name, value, maxima in checks:
        applicable = [m for m in maxima if m is not None]
        if value is not None and applicable and value > max(applicable):
            sized = name in ("memory", "output_bytes", "disk")
            shown, top = (
                (human_size(int(value)), human_size(int(max(applicable))))
                if sized
                else (value, max(applicable))
            )
            violations.append(f"budget.{name}: {shown} is above the {tier} tier's maximum of {top}")
    return violations


def enforce(spec: SandboxSpec, tier: str | None = None) -> SandboxSpec:
    """Return ``spec`` if admitted, else raise PolicyViolation with every reason."""
    violations = admit(spec, tier)
    if violations:
        raise PolicyViolation(violations)
    return spec
