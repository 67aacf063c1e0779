"""The one reviewable statement of what a job may do, and ``admit()`` which checks it.

A ``SandboxSpec`` loads from and dumps to TOML. Every tier maps the same spec onto its own
mechanism (fuel and store limits for WebAssembly, cgroups and namespaces for containers).
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import functools
import logging
import math
import os
import posixpath
import re
import tomllib
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError

from hybrid import tiers
from hybrid.errors import InvalidInput, PolicyError, PolicyViolation
from hybrid.paths import cache_root, display, read_text_input, state_root
from hybrid.tiers.base import TierLimits as TierLimits  # re-exported
from hybrid.tiers.wasm import WASM_DISK_MAX as WASM_DISK_MAX  # re-exported

log = logging.getLogger(__name__)

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
    size = float(number) * 1024 ** _POWERS[unit.lower()]
    if not math.isfinite(size):
        raise ValueError(f"not a size: {value!s:.20}... is too large")
    return int(size)


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


def _number(value: Any) -> Any:
    # pydantic would read `fuel = true` as 1: a boolean where a budget belongs is a mistake.
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not {str(value).lower()}")
    return value


Count = Annotated[int, BeforeValidator(_number)]
Number = Annotated[float, BeforeValidator(_number)]


def moment(value: Any) -> Any:
    """A date or time as an aware datetime: ``2021-05-20`` is its midnight, UTC unless it says."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a date (2021-05-20 or 2021-05-20T16:35Z)") from None
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


Moment = Annotated[AwareDatetime, BeforeValidator(moment)]

# Control characters. A NUL splits a value wherever it is written as a C string or into a
# NUL-separated list (bwrap's --args, /proc/PID/environ): the rest of the value becomes more
# options. The others (newline, escape, ...) have no place in a name, a path or a host pattern.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def text_problem(value: str, *, data: bool = False) -> str | None:
    """Why ``value`` may not reach an argv, an environment or a path, or None.

    ``data`` is for values a job receives verbatim (an argv element, an environment value): a
    multi-line script or a certificate is legitimate there, so only a NUL is refused. Everything
    else (names, paths, images, host patterns) refuses every control character.
    """
    if "\0" in value:
        # A value (an env.set secret, say) is not repeated in the message: its position is.
        if data:
            return f"must not contain a NUL byte (at character {value.index(chr(0))})"
        return f"must not contain a NUL byte: {value!r}"
    if not data and _CONTROL.search(value):
        return f"must not contain control characters: {value!r}"
    return None


def check_text(value: str, what: str, *, data: bool = False) -> str:
    """``value``, or InvalidInput naming ``what`` when text_problem() refuses it."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what}: must be a string, got {type(value).__name__}")
    problem = text_problem(value, data=data)
    if problem:
        raise InvalidInput(f"{what}: {problem}")
    return value


def env_name_problem(name: str) -> str | None:
    """Why ``name`` is not an environment variable name, or None."""
    if not name:
        return "an environment variable name must not be empty"
    if "=" in name:
        return f"an environment variable name must not contain '=': {name!r}"
    if _CONTROL.search(name) or any(c.isspace() for c in name):
        return (
            f"an environment variable name must not contain control characters or spaces: {name!r}"
        )
    return None


def check_env(env: dict[str, str] | None, what: str = "env") -> dict[str, str]:
    """``env`` (names and values checked as in a policy), or InvalidInput."""
    for name, value in (env or {}).items():
        problem = env_name_problem(name) if isinstance(name, str) else "names must be strings"
        if problem:
            raise InvalidInput(f"{what}: {problem}")
        check_text(value, f"{what}: {name}", data=True)
    return dict(env or {})


def _plain(value: str) -> str:
    problem = text_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _data(value: str) -> str:
    problem = text_problem(value, data=True)
    if problem:
        raise ValueError(problem)
    return value


def _plain_path(value: Path) -> Path:
    _plain(os.fspath(value))
    return value


def _env_name(value: str) -> str:
    problem = env_name_problem(value)
    if problem:
        raise ValueError(problem)
    return value


Plain = Annotated[str, AfterValidator(_plain)]
"""A name, path, image or pattern: no control character at all."""
Data = Annotated[str, AfterValidator(_data)]
"""A value a job receives verbatim (argv element, environment value): no NUL."""
PlainPath = Annotated[Path, AfterValidator(_plain_path)]
"""A host path: no control character."""
EnvName = Annotated[str, AfterValidator(_env_name)]
"""An environment variable name: no '=', no control character, no space."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Budget(_Strict):
    """Hard limits for one run."""

    wall_seconds: Number = Field(30.0, gt=0, description="Wall-clock deadline in seconds.")
    memory: Size = Field(256 * 1024**2, gt=0, description="Memory cap in bytes (accepts 256M, 1G).")
    fuel: Count = Field(2_000_000_000, gt=0, description="WebAssembly fuel (roughly instructions).")
    pids: Count = Field(64, gt=0, description="Maximum processes and threads (process tiers).")
    cpus: Number = Field(1.0, gt=0, description="CPU share in cores (process tiers).")
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

WORKSTATION_BUDGET = {
    "wall_seconds": 900.0,
    "memory": 4 * 1024**3,
    "pids": 1024,
    "cpus": 2.0,
}
"""Budget defaults of a workstation command (``ws up``, ``hybrid.deps.up``): sized for a real
test suite (requests' whole suite under 30 s / 256 MiB was killed at 11%). A field the spec
sets explicitly (a policy file, --timeout, --memory) is kept; cpus never exceeds the host's."""


def for_workstation(spec: SandboxSpec) -> SandboxSpec:
    """``spec`` with WORKSTATION_BUDGET for every budget field it leaves at the one-shot default."""
    given = spec.budget.model_fields_set if "budget" in spec.model_fields_set else set()
    update: dict[str, Any] = {
        name: value for name, value in WORKSTATION_BUDGET.items() if name not in given
    }
    if "cpus" in update:
        update["cpus"] = min(float(update["cpus"]), float(os.cpu_count() or 1))
    if not update:
        return spec
    budget = spec.budget.model_copy(update=update)
    budget.__pydantic_fields_set__ = set(spec.budget.model_fields_set)  # still "not given"
    return spec.model_copy(update={"budget": budget})


class Mount(_Strict):
    """A host path made visible inside the sandbox."""

    source: PlainPath = Field(description="Host path.")
    target: Plain = Field(description="Absolute path inside the sandbox.")
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
    allow: list[Plain] = Field(
        default_factory=list, description="host[:port] patterns reachable in egress mode."
    )


class Environment(_Strict):
    """The environment a job sees: nothing from the host unless named here."""

    allow: list[EnvName] = Field(
        default_factory=list, description="Names that may be set or inherited."
    )
    # A value may hold newlines (a certificate, a JSON document): it reaches the job verbatim.
    set: dict[EnvName, Data] = Field(
        default_factory=dict, description="Variables set to these values."
    )
    inherit: list[EnvName] = Field(
        default_factory=list, description="Variables copied from the host."
    )

    def resolve(self) -> dict[str, str]:
        """The concrete environment: ``set`` plus the inherited host values that exist."""
        env = {name: os.environ[name] for name in self.inherit if name in os.environ}
        env.update(self.set)
        return env


class DepsPolicy(_Strict):
    """Which of a project's dependencies may enter a workstation (``ws up --deps``, ``hybrid deps``).

    Artifacts are resolved and downloaded on the host, pinned by name, version and sha256, and
    checked against these rules (``hybrid.deps.admit``) before anything enters.
    """

    allow: list[Plain] = Field(
        default_factory=list,
        description="Package name patterns that may enter (globs); empty means any not denied.",
    )
    deny: list[Plain] = Field(
        default_factory=list, description="Package name patterns that never enter (globs)."
    )
    require_pins: bool = Field(
        False,
        description="Every requirement the project declares must pin one version (==) or come from a lockfile.",
    )
    approved: PlainPath | None = Field(
        None,
        description="A manifest file (hybrid deps lock --output); nothing outside its (name, version, sha256) enters.",
    )
    max_bytes: Size = Field(
        2 * 1024**3,
        gt=0,
        description="Total size the admitted artifacts may have (accepts 500M, 2G).",
    )
    groups: list[Plain] = Field(
        default_factory=lambda: ["test", "tests", "testing", "dev"],
        description="Optional extras and dependency groups installed with the project's own.",
    )
    exclude_newer: Moment | None = Field(
        None,
        description="Resolve what the project names as of this time: no release the index says "
        "was published after it (an old commit tested with the tools of its day). What those "
        "depend on stays free, to run on the image's interpreter.",
    )


_SERVICE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


class Service(_Strict):
    """A service its workstation's commands reach on 127.0.0.1 (a database, a cache).

    It runs in its own hardened container in the workstation's network namespace, which holds
    only ``lo``: nothing else (another workstation, the host) reaches it, and it reaches nothing.
    """

    kind: Literal["postgres", "redis", "image"] = Field(
        description="postgres or redis (images built here from Debian packages), or image (any local image)."
    )
    name: Plain | None = Field(
        None, description="Name (a-z, 0-9, -), unique in the workstation; default the kind."
    )
    version: Plain | None = Field(
        None, description="Major version (postgres 15, redis 7: what the Debian release ships)."
    )
    image: Plain | None = Field(
        None, description="Local image to run (kind image; overrides the built one otherwise)."
    )
    port: int | None = Field(
        None, gt=0, lt=65536, description="TCP port on 127.0.0.1 (default 5432 / 6379)."
    )
    env: dict[EnvName, Data] = Field(
        default_factory=dict,
        description=(
            "Its settings: POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB; REDIS_PASSWORD; "
            "anything for kind image. Throwaway values: they are kept in engine labels."
        ),
    )
    command: list[Data] | None = Field(None, description="Command of kind image (default its own).")
    health: list[Data] | None = Field(
        None,
        description="argv run inside it until it exits 0 (default pg_isready / redis-cli ping).",
    )
    data: Plain | None = Field(
        None, description="Data directory kept in a volume and snapshots (kind image)."
    )
    ready_seconds: Number = Field(30.0, gt=0, description="How long it may take to be healthy.")
    memory: Size = Field(256 * 1024**2, gt=0, description="Memory cap in bytes.")
    pids: Count = Field(128, gt=0, description="Maximum processes and threads.")
    cpus: Number = Field(1.0, gt=0, description="CPU share in cores.")
    disk: Size = Field(1024**3, gt=0, description="Bytes its data volume may hold.")

    @property
    def key(self) -> str:
        """Its name in the workstation: ``name`` or the kind."""
        return self.name or self.kind


def _known_tier(value: str) -> str:
    # A registry lookup rather than a Literal, so a registered tier is valid without editing here.
    known = ("auto", *tiers.names())
    if value not in known:
        expected = ", ".join(repr(t) for t in known[:-1]) + f" or {known[-1]!r}"
        raise PydanticCustomError(
            "literal_error", "Input should be {expected}", {"expected": expected}
        )
    return value


Tier = Annotated[str, AfterValidator(_known_tier)]
"""``auto`` or the name of a registered tier (hybrid.tiers)."""


class SandboxSpec(_Strict):
    """What a job may do, on any tier."""

    tier: Tier = Field("auto", description="The tier to run on; auto lets the router choose.")
    budget: Budget = Field(default_factory=Budget)
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    mounts: list[Mount] = Field(default_factory=list)
    workspace: Plain = Field("/workspace", description="The one writable area inside the sandbox.")
    env: Environment = Field(default_factory=Environment)
    deps: DepsPolicy | None = Field(
        None, description="Dependency admission for `ws up --deps` (unset: the defaults)."
    )
    services: list[Service] = Field(
        default_factory=list, description="Services started with a workstation ([[services]])."
    )

    @classmethod
    def from_toml(cls, path: str | Path) -> SandboxSpec:
        """Load a spec from a TOML file; any problem raises PolicyError with the field at fault."""
        path = Path(path)
        text = read_text_input(path, "policy file", PolicyError)
        try:
            data = tomllib.loads(text)
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
            # A key is the user's text: shown escaped when it holds a control character.
            where = ".".join(
                repr(str(p)) if _CONTROL.search(str(p)) else str(p) for p in first["loc"]
            )
            where = where or "(top level)"
            more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
            message = first["msg"].removeprefix("Value error, ")
            raise PolicyError(f"{source}: {where}: {message}{more}") from None

    def to_toml(self) -> str:
        """Dump as TOML that from_toml reads back to an equal spec."""
        data = self.model_dump(mode="json")
        for key in ("memory", "output_bytes"):
            data["budget"][key] = format_size(data["budget"][key])
        if data["budget"]["disk"] is None:
            del data["budget"]["disk"]  # TOML has no null: unset means the tier's default
        else:
            data["budget"]["disk"] = format_size(data["budget"]["disk"])
        if data["deps"] is None:
            del data["deps"]
        else:
            data["deps"]["max_bytes"] = format_size(data["deps"]["max_bytes"])
            data["deps"] = {k: v for k, v in data["deps"].items() if v is not None}
        if data["services"]:
            data["services"] = [
                {k: v for k, v in service.items() if v is not None} for service in data["services"]
            ]
        else:
            del data["services"]
        return tomli_w.dumps(data)


def tier_limits(tier: str) -> TierLimits:
    """Maximum budgets for a tier on this host (wasm32 caps memory at 4 GiB)."""
    return tiers.get(tier).limits()


def __getattr__(name: str) -> Any:
    # TIERS reads the registry each time, so a tier registered later is seen here too.
    if name == "TIERS":
        return tiers.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The smallest budget any tier can start anything in: asking for less is a mistake, not a
# tighter limit. Each tier adds its own (``Tier.minimums``, e.g. the engine refuses memory under
# 6 MiB).
MINIMUMS: dict[str, tuple[float, str]] = {
    "wall_seconds": (0.01, "nothing starts in less"),
    "cpus": (0.01, "the engine's smallest share"),
    "output_bytes": (256, "room for one error line"),
}

# Host paths that hold credentials or control of the host. Mounting one, or a directory that
# contains one, or naming one as an input file hands the job ambient authority. The module cache
# (compiled code the host runs) and the state directory (diff baselines, secret values) are
# secret where they are by default and where the environment moved them (added at check time).
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
    "~/.config/hub",
    "~/.pypirc",
    "~/.npmrc",
    "~/.m2",
    "~/.gradle",
    "~/.cargo/credentials",
    "~/.cargo/credentials.toml",
    "~/.vault-token",
    "~/.cache/hybrid",
    "~/.local/state/hybrid",
    "/root/.ssh",
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/docker",
    "/var/run/docker",
    "/var/lib/docker",
    "/run/containerd",
    "/var/lib/containerd",
    "/proc",
    "/sys",
)

# Directories of the host system: never mounted writable, and never a sandbox's workspace (inside,
# a volume there would shadow the system the sandbox runs on).
SYSTEM_DIRS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var",
)

# Variable names that carry credentials: never inherited from the host, even when allow-listed.
# Wide on purpose: a false positive costs one `env.set` with a scoped value, a miss leaks a key.
# URLs are judged by value as well: an inherited *_URL / *_URI whose host value carries a user
# (scheme://user:pass@host) is a credential whatever its name.
SECRET_ENV = (
    "*TOKEN*",
    "*SECRET*",
    "*PASSWORD*",
    "*PASSWD*",
    "*PASSPHRASE*",
    "*CREDENTIAL*",
    "*KEY*",  # API_KEY, OPENAI_APIKEY, AWS_ACCESS_KEY_ID, SIGNING_KEY
    "*_PAT",  # personal access tokens: GH_PAT, ADO_PAT
    "*_PAT_*",
    "*AUTH",  # NPM_AUTH
    "*AUTH_*",  # SSH_AUTH_SOCK, OAUTH_CLIENT
    "*AUTHORIZATION*",
    "*AUTHORITY",  # XAUTHORITY: the X11 cookie
    "*COOKIE*",
    "*PRIVATE*",
    "*DATABASE_URL*",
    "*DSN",  # SENTRY_DSN, PG_DSN: connection strings with their password
    "AWS_*",
    "VAULT_*",
    "KUBECONFIG",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "GPG_AGENT_INFO",
)
_URL_WITH_USER = re.compile(r"^[a-z][a-z0-9+.-]*://[^/?#\s]*@", re.IGNORECASE)
_WILDCARD = re.compile(r"[*?\[\]]")

_secret_override: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "hybrid_allow_secret_paths", default=False
)


@contextlib.contextmanager
def allow_secret_paths() -> Iterator[None]:
    """Let inputs and mounts name host secret paths in this block (the CLI's --allow-secret-path).

    For a user who means it: every use is logged as a warning on the ``hybrid.policy`` logger.
    """
    token = _secret_override.set(True)
    try:
        yield
    finally:
        _secret_override.reset(token)


def _secret_paths() -> list[Path]:
    return _secret_paths_for(os.path.expanduser("~"), str(cache_root()), str(state_root()))


@functools.lru_cache(maxsize=8)
def _secret_paths_for(home: str, cache: str, state: str) -> list[Path]:
    # Cached per home and directories: resolving ~40 paths costs ~0.5 ms, as much as a small wasm run.
    paths = []
    for raw in (*SECRET_PATHS, cache, state):
        path = Path(os.path.expanduser(raw))
        paths.append(Path(os.path.normpath(path.absolute())))
        if path.exists():
            paths.append(path.resolve())
    return paths


def _within(path: PurePosixPath | Path, root: PurePosixPath | Path) -> bool:
    # A prefix of parts, not ``root in path.parents``: that compares a Path per ancestor, and
    # every check of an input against ~40 secret paths cost ~5 ms.
    parts = root.parts
    return path.parts[: len(parts)] == parts


def _host_forms(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` as written (absolute, normalised) and with every symlink resolved."""
    raw = Path(os.path.expanduser(os.fspath(path)))
    forms = [Path(os.path.normpath(raw.absolute()))]
    # A loop or a NUL byte: the path as written is all there is to judge.
    with contextlib.suppress(OSError, RuntimeError, ValueError):
        forms.append(raw.resolve())
    return forms


def secret_path_hit(path: str | os.PathLike[str]) -> Path | None:
    """The host secret path that ``path`` is, lies in or contains (symlinks resolved), or None."""
    forms = _host_forms(path)
    for secret in _secret_paths():
        if any(_within(form, secret) or _within(secret, form) for form in forms):
            return secret
    return None


_INPUT_FIX = (
    "reads the host secret path {secret} (pass --allow-secret-path, or use "
    "hybrid.policy.allow_secret_paths(), if you mean it)"
)


def check_input_path(path: str | os.PathLike[str], what: str = "input file") -> None:
    """Refuse an input file the user named that is, or is inside, a host secret path.

    The same rule as mounts (symlinks resolved). Raises PolicyViolation unless the caller is
    inside ``allow_secret_paths()``, which logs the use instead.
    """
    _check_input(path, secret_path_hit(path), what)


def check_opened_input(path: str | os.PathLike[str], fd: int, what: str = "input file") -> None:
    """check_input_path for a file already open as ``fd``: judges what was opened, not the name."""
    secret = secret_path_hit(path)
    if secret is None:
        with contextlib.suppress(OSError):  # no /proc: the resolved name is the best there is
            opened = os.readlink(f"/proc/self/fd/{fd}")
            if opened.startswith("/"):
                secret = secret_path_hit(opened)
    _check_input(path, secret, what)


def _check_input(path: str | os.PathLike[str], secret: Path | None, what: str) -> None:
    if secret is None:
        return
    subject = f"{what} {display(path)}"
    if _secret_override.get():
        log.warning(
            "%s: reads the host secret path %s (allowed: --allow-secret-path)", subject, secret
        )
        return
    raise PolicyViolation([f"{subject}: {_INPUT_FIX.format(secret=secret)}"])


def _allow_problem(pattern: str) -> str | None:
    """Why a network.allow pattern is unsafe, or None."""
    pattern = pattern.strip().lower()
    if pattern.startswith("[") and ":" in pattern.partition("]")[0]:
        # An IPv6 literal, [addr] or [addr]:port, as the proxy reads it ([a-z]* is a glob).
        host, closed, rest = pattern[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            return "an IPv6 address goes in brackets, as [addr] or [addr]:port"
        sep, port = rest[:1], rest[1:]
    else:
        host, sep, port = pattern.partition(":")
    if not host:
        return "names no host"
    if sep and port != "*" and not (port.isdigit() and 0 < int(port) < 65536):
        return f"port {port!r} is not a port number or *"
    if _WILDCARD.search(host):
        rest = host[2:] if host.startswith("*.") else ""
        if not rest or _WILDCARD.search(rest) or len([p for p in rest.split(".") if p]) < 2:
            return (
                "matches hosts in every domain; name the hosts, or lead a domain of two or "
                "more labels with '*.' (e.g. *.example.com)"
            )
    return None


def _workspace_problem(value: str) -> str | None:
    path = PurePosixPath(value)
    if not path.is_absolute() or path == PurePosixPath("/"):
        return f"must be an absolute directory other than /, got {value!r}"
    if ".." in path.parts:
        return f"must not contain '..', got {value!r}"
    normal = PurePosixPath(posixpath.normpath("/" + value.lstrip("/")))
    for system in SYSTEM_DIRS:
        if _within(normal, PurePosixPath(system)):
            return f"{value!r} is the system directory {system} or inside it; use e.g. /workspace"
    return None


def _system_dir(path: Path) -> str | None:
    if path == Path("/"):
        return "/"
    if _within(path, Path("/var/tmp")):
        return None  # scratch space like /tmp, not the system's
    return next((d for d in SYSTEM_DIRS if _within(path, Path(d))), None)


def _credential_env(name: str) -> bool:
    if any(fnmatch.fnmatchcase(name.upper(), pat) for pat in SECRET_ENV):
        return True
    return bool(_URL_WITH_USER.match(os.environ.get(name, "")))


def admit(spec: SandboxSpec, tier: str | None = None) -> list[str]:
    """Every reason ``spec`` may not run (on ``tier``, default the spec's own); empty means admitted."""
    violations: list[str] = _text_violations(spec)
    tier = tier or spec.tier
    chosen = [tiers.get(t) for t in (tiers.names() if tier == "auto" else (tier,))]
    limits = [t.limits() for t in chosen]

    if spec.network.mode == "egress":
        if not spec.network.allow:
            violations.append(
                'network: egress without an allow-list; name the hosts in network.allow or use mode = "none"'
            )
        if not any(lim.network for lim in limits):
            violations.append(
                f'network: the {tier} tier has no network; use mode = "none" or a container tier'
            )
        refusal = tiers.get(tier).egress_refusal if tier != "auto" else None
        if refusal:
            violations.append(refusal)
    for i, pattern in enumerate(spec.network.allow):
        problem = _allow_problem(pattern)
        if problem:
            violations.append(f"network.allow[{i}] {pattern!r}: {problem}")

    problem = _workspace_problem(spec.workspace)
    if problem:
        violations.append(f"workspace: {problem}")
    workspace = PurePosixPath(spec.workspace)
    for i, mount in enumerate(spec.mounts):
        where = f"mounts[{i}] {display(mount.source)} -> {mount.target}"
        forms = _host_forms(mount.source)
        if mount.mode == "rw":
            if not _within(PurePosixPath(mount.target), workspace):
                violations.append(
                    f"{where}: writable mount outside the workspace {spec.workspace}; mount it read-only or under the workspace"
                )
            system = next((d for d in map(_system_dir, forms) if d), None)
            if system:
                violations.append(
                    f"{where}: writable mount of the host system directory {system}; mount it read-only"
                )
        secret = secret_path_hit(mount.source)
        if secret is not None:
            if _secret_override.get():
                log.warning(
                    "%s: exposes the host secret path %s (allowed: --allow-secret-path)",
                    where,
                    secret,
                )
            else:
                violations.append(
                    f"{where}: exposes the host secret path {secret}; mount a narrower directory"
                )

    for name in sorted(set(spec.env.set) | set(spec.env.inherit)):
        if name not in spec.env.allow:
            violations.append(f"env: {name} is not on the allow-list (env.allow)")
    for name in spec.env.inherit:
        if _credential_env(name):
            violations.append(
                f"env: {name} looks like a credential; host credentials are never inherited (set a scoped value in env.set)"
            )

    violations += _service_problems(spec, tier)

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
        if value is None:
            continue  # disk unset: the tier's own default
        sized = name in ("memory", "output_bytes", "disk")

        def show(n: float, sized: bool = sized) -> str:
            return human_size(int(n)) if sized else str(n) if isinstance(n, int) else f"{n:g}"

        applicable = [m for m in maxima if m is not None]
        if applicable and value > max(applicable):
            violations.append(
                f"budget.{name}: {show(value)} is above the {tier} tier's maximum of {show(max(applicable))}"
            )
        floors = [t.minimums.get(name) or MINIMUMS.get(name) for t in chosen]
        known = [f for f in floors if f is not None]
        if known:
            floor, why = min(known)
            if value < floor:
                violations.append(
                    f"budget.{name}: {show(value)} is below the {tier} tier's minimum of {show(floor)} ({why})"
                )
    return violations


def _text_violations(spec: SandboxSpec) -> list[str]:
    """The validators' text rules again, for a spec that skipped them (``model_copy(update=)``,
    ``model_construct``): every string of it that reaches an argv, an environment or a path."""
    plain: list[tuple[str, str]] = [("workspace", spec.workspace)]
    data: list[tuple[str, str]] = []
    names: list[tuple[str, str]] = []
    for i, mount in enumerate(spec.mounts):
        plain += [
            (f"mounts[{i}].source", os.fspath(mount.source)),
            (f"mounts[{i}].target", mount.target),
        ]
    plain += [(f"network.allow[{i}]", pattern) for i, pattern in enumerate(spec.network.allow)]
    env = spec.env
    names += [("env.allow", n) for n in env.allow] + [("env.inherit", n) for n in env.inherit]
    for name, value in env.set.items():
        names.append(("env.set", name))
        data.append((f"env.set.{name}", value))
    for i, service in enumerate(spec.services):
        where = f"services[{i}]"
        for field in ("name", "version", "image", "data"):
            value = getattr(service, field)
            if value is not None:
                plain.append((f"{where}.{field}", value))
        for name, value in service.env.items():
            names.append((f"{where}.env", name))
            data.append((f"{where}.env.{name}", value))
        for field in ("command", "health"):
            data += [(f"{where}.{field}", v) for v in getattr(service, field) or ()]
    if spec.deps is not None:
        deps = spec.deps
        plain += [("deps.allow", v) for v in deps.allow] + [("deps.deny", v) for v in deps.deny]
        plain += [("deps.groups", v) for v in deps.groups]
        if deps.approved is not None:
            plain.append(("deps.approved", os.fspath(deps.approved)))
    found = []
    checks = [(w, v, False) for w, v in plain] + [(w, v, True) for w, v in data]
    for where, value, verbatim in checks:
        problem = text_problem(str(value), data=verbatim)
        if problem:
            found.append(f"{where}: {problem}")
    for where, name in names:
        problem = env_name_problem(str(name))
        if problem:
            found.append(f"{where}: {problem}")
    return found


def _service_problems(spec: SandboxSpec, tier: str) -> list[str]:
    if not spec.services:
        return []
    problems = []
    if tier != "auto":
        refusal = getattr(tiers.get(tier), "services_refusal", "")
        if refusal is None:
            pass
        elif refusal:
            problems.append(refusal)
        else:
            problems.append(f"services: the {tier} tier runs no services; use the docker tier")
    from hybrid.workstation.services import default_port
    from hybrid.workstation.services import problems as settings_problems

    names: set[str] = set()
    ports: dict[int, str] = {}
    if spec.network.mode == "egress":
        from hybrid.workstation.proxy import PORT

        ports[PORT] = "the egress proxy"
    for i, service in enumerate(spec.services):
        where = f"services[{i}] {service.key}"
        if not _SERVICE_NAME.match(service.key):
            problems.append(f"{where}: name must be 1-31 of a-z 0-9 - starting with a letter")
        if service.key in names:
            problems.append(f"{where}: two services are named {service.key}; set name")
        names.add(service.key)
        if service.kind == "image" and not service.image:
            problems.append(f"{where}: kind image needs image = a local image")
        if service.kind != "image" and (service.command or service.data):
            problems.append(f"{where}: command and data are for kind image")
        problems += [f"{where}: {problem}" for problem in settings_problems(service)]
        if service.data is not None and not PurePosixPath(service.data).is_absolute():
            problems.append(f"{where}: data must be an absolute path")
        port = service.port or default_port(service.kind)
        if port in ports:
            problems.append(f"{where}: port {port} is taken by {ports[port]}; set port")
        if port is not None:
            ports[port] = service.key
    return problems


def enforce(spec: SandboxSpec, tier: str | None = None) -> SandboxSpec:
    """Return ``spec`` if admitted, else raise PolicyViolation with every reason."""
    violations = admit(spec, tier)
    if violations:
        raise PolicyViolation(violations)
    return spec
