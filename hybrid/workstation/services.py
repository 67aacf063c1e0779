"""Services of a workstation: what each kind runs, its image and the variables its users get.

Images are built here like the base image (no registry): ``FROM`` the base image, ``apt-get
install`` from this machine's own Debian mirror (images.find_mirror), a cluster initialised at
build time so a start is only a start. Every kind keeps its data under one directory, which
lives in a volume while it runs and goes into the image when the workstation is snapshotted.
The engine side (containers, volumes, snapshots) is in docker/services.py.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

from hybrid.errors import InvalidInput, WorkstationError

if TYPE_CHECKING:
    from hybrid.policy import Service
    from hybrid.workstation.images import ImageInfo

DATA = "/var/lib/hybrid-service"
"""Where a built service keeps its data (a volume while it runs)."""

_DEFAULTS = {"postgres": ("15", 5432), "redis": ("7", 6379)}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def default_port(kind: str) -> int | None:
    """The port a kind listens on unless told otherwise (None for kind image)."""
    return _DEFAULTS[kind][1] if kind in _DEFAULTS else None


def port_of(service: Service) -> int | None:
    return service.port or default_port(service.kind)


def version_of(service: Service) -> str | None:
    return service.version or (_DEFAULTS[service.kind][0] if service.kind in _DEFAULTS else None)


def image_of(service: Service) -> str:
    """The image it runs: its own ``image``, else the one ``hybrid image bootstrap --service`` builds."""
    return service.image or service_tag(service.kind, version_of(service) or "")


def service_tag(kind: str, version: str) -> str:
    return f"hybrid/{kind}:{version}"


def data_of(service: Service) -> str | None:
    """The directory kept in a volume and in snapshots (None: a kind image that names none)."""
    return service.data if service.kind == "image" else DATA


def _pg_bin(service: Service) -> str:
    return f"/usr/lib/postgresql/{version_of(service)}/bin"


def _postgres(service: Service) -> tuple[str, str, str]:
    env = service.env
    user = env.get("POSTGRES_USER", "hybrid")
    return user, env.get("POSTGRES_PASSWORD", "hybrid"), env.get("POSTGRES_DB", user)


def problems(service: Service) -> list[str]:
    """What is wrong with a service's settings (empty: fine)."""
    if service.kind != "postgres":
        return []
    user, _, database = _postgres(service)
    return [
        f"{key} {value!r} must be a plain SQL identifier (letters, digits, _)"
        for key, value in (("POSTGRES_USER", user), ("POSTGRES_DB", database))
        if not _IDENTIFIER.match(value)
    ]


READY = "hybrid-service-ready"
"""What a built kind's container prints once it is healthy and set up."""

_WRAPPER = """{server} &
pid=$!
trap 'kill -TERM $pid; wait $pid; exit 0' TERM INT
until {health} >/dev/null 2>&1; do
    kill -0 $pid 2>/dev/null || exit 1
    sleep 0.05
done
{setup}
echo {ready}
wait $pid
"""


def command_of(service: Service) -> list[str] | None:
    """Its container's command (None: the image's own).

    A built kind runs under a small shell that checks its health and runs its setup right
    there, then prints READY: far cheaper than one engine exec per probe on a loaded host.
    """
    server = _server(service)
    if server is None or service.kind == "image":
        return server
    health = _own_health(service)
    setup = setup_of(service)
    script = _WRAPPER.format(
        server=shlex.join(server),
        health=shlex.join(health),
        setup=f"{shlex.join(setup)} || exit 1" if setup else ":",
        ready=READY,
    )
    return ["sh", "-c", script]


def _own_health(service: Service) -> list[str]:
    """The built kind's own health argv (the wrapper's, whatever ``health`` says)."""
    port = str(port_of(service))
    if service.kind == "postgres":
        return [f"{_pg_bin(service)}/pg_isready", "-h", "127.0.0.1", "-p", port, "-q"]
    return ["redis-cli", "-h", "127.0.0.1", "-p", port, "ping"]


def _server(service: Service) -> list[str] | None:
    port = str(port_of(service))
    if service.kind == "postgres":
        return [
            f"{_pg_bin(service)}/postgres",
            "-D",
            f"{DATA}/data",
            "-p",
            port,
            "-k",
            "/tmp",
            "-c",
            "listen_addresses=127.0.0.1",
        ]
    if service.kind == "redis":
        argv = ["redis-server", "--bind", "127.0.0.1", "--port", port, "--dir", DATA]
        argv += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        if service.env.get("REDIS_PASSWORD"):
            argv += ["--requirepass", service.env["REDIS_PASSWORD"]]
        return argv
    return service.command


def health_of(service: Service) -> list[str] | None:
    """The argv run inside it (by the engine) until it exits 0; None: the kind checks itself."""
    if service.health:
        return service.health
    return None


def self_checking(service: Service) -> bool:
    """Whether its container prints READY itself (a built kind without its own ``health``)."""
    return service.kind != "image" and not service.health


def setup_of(service: Service) -> list[str] | None:
    """Run once it is healthy (idempotent): postgres makes its user and database."""
    if service.kind != "postgres":
        return None
    user, password, database = _postgres(service)
    quoted = password.replace("'", "''")
    sql = (
        f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{user}') THEN "
        f'CREATE ROLE "{user}" LOGIN SUPERUSER; END IF; END$$;\n'
        f"ALTER ROLE \"{user}\" PASSWORD '{quoted}';\n"
        f'SELECT \'CREATE DATABASE "{database}" OWNER "{user}"\' '
        f"WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{database}')\\gexec\n"
    )
    psql = f"{_pg_bin(service)}/psql -X -q -h /tmp -p {port_of(service)} -U postgres -d postgres"
    return ["sh", "-c", f'printf "%s" "$1" | {psql} -v ON_ERROR_STOP=1 -f -', "setup", sql]


def flush_of(service: Service) -> list[str] | None:
    """Run before its data is copied into a snapshot, so the copy holds everything."""
    port = str(port_of(service))
    if service.kind == "redis":
        return ["redis-cli", "-h", "127.0.0.1", "-p", port, "save"]
    if service.kind == "postgres":
        psql = f"{_pg_bin(service)}/psql"
        return [psql, "-X", "-q", "-h", "/tmp", "-p", port, "-U", "postgres", "-c", "CHECKPOINT"]
    return None


def service_env(service: Service) -> dict[str, str]:
    """Variables its container and the commands run inside it (``health``, ``flush``) get."""
    if service.kind == "redis" and service.env.get("REDIS_PASSWORD"):
        return {"REDISCLI_AUTH": service.env["REDIS_PASSWORD"]}
    return {}


def environment(services: list[Service]) -> dict[str, str]:
    """What a workstation's commands get: DATABASE_URL and PG* for the first postgres,
    REDIS_URL for the first redis, and NAME_URL for every service that has a name of its own."""
    env: dict[str, str] = {}
    for service in services:
        port = port_of(service)
        url = None
        if service.kind == "postgres":
            user, password, database = _postgres(service)
            url = f"postgresql://{user}:{password}@127.0.0.1:{port}/{database}"
            if "DATABASE_URL" not in env:
                env["DATABASE_URL"] = url
                env.update(
                    PGHOST="127.0.0.1",
                    PGPORT=str(port),
                    PGUSER=user,
                    PGPASSWORD=password,
                    PGDATABASE=database,
                )
        elif service.kind == "redis":
            secret = service.env.get("REDIS_PASSWORD")
            url = f"redis://{f':{secret}@' if secret else ''}127.0.0.1:{port}/0"
            env.setdefault("REDIS_URL", url)
        if service.name and url:
            env[f"{service.name.upper().replace('-', '_')}_URL"] = url
    return env


# -- images -------------------------------------------------------------------------------------

_PACKAGES = {"postgres": "postgresql-{version}", "redis": "redis-server"}


def _script(kind: str, version: str, mirror: str, suite: str) -> str:
    """What the builder (root, from the base image) runs: the packages, then the data directory."""
    apt = "apt-get -o Dir::Etc::SourceList=/tmp/hybrid.list -o Dir::Etc::SourceParts=/nonexistent"
    package = _PACKAGES[kind].format(version=version)
    steps = [
        "set -e",
        f"printf 'deb %s %s main\\n' {shlex.quote(mirror)} {shlex.quote(suite)} > /tmp/hybrid.list",
        f"{apt} update -qq",
        f"DEBIAN_FRONTEND=noninteractive {apt} install -y -qq --no-install-recommends {package}",
        "rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /tmp/hybrid.list",
        f"mkdir -p {DATA}",
    ]
    if kind == "postgres":
        steps += [
            f"chown postgres:postgres {DATA} && chmod 700 {DATA}",
            # Trust over the local socket (setup inside), passwords over TCP (the workstation).
            f"runuser -u postgres -- /usr/lib/postgresql/{version}/bin/initdb -D {DATA}/data"
            " -U postgres -E UTF8 --locale=C.UTF-8 --auth-local=trust"
            " --auth-host=scram-sha-256 --no-sync",
        ]
    else:
        steps += [
            f"chown redis:redis {DATA} && chmod 700 {DATA}",
            f"redis-server --version | grep -q 'v={version}\\.'",
        ]
    return "\n".join(steps) + "\n"


def bootstrap_service(
    kind: str,
    version: str | None = None,
    *,
    mirror: str | None = None,
    suite: str | None = None,
    force: bool = False,
    on_progress: Callable[[str], None] | None = None,
) -> ImageInfo:
    """Build the ``kind`` service image from the base image and Debian packages; reuse it when present."""
    from hybrid.workstation import docker as _docker
    from hybrid.workstation import images
    from hybrid.workstation.docker.labels import _owner

    if kind not in _DEFAULTS:
        raise InvalidInput(f"no service kind {kind!r} (use: {', '.join(_DEFAULTS)})")
    version = version or _DEFAULTS[kind][0]
    if not re.fullmatch(r"[0-9][0-9.]*", version):
        raise InvalidInput(f"service version must be a number like 15, got {version!r}")
    tag = service_tag(kind, version)
    if not force:
        existing = images.get(tag)
        if existing is not None:
            return existing
    base = images.bootstrap(on_progress=on_progress)  # the base image first (reused if present)
    suite = suite or images._codename()
    mirror = mirror or images.find_mirror(suite)
    progress = on_progress or (lambda _line: None)
    progress(f"building {tag} from {base.tag} with {mirror} {suite}")
    api = _docker.client().api
    user = {"postgres": "postgres", "redis": "redis"}[kind]
    builder = None
    tail: list[str] = []
    # A container and a commit rather than `docker build`: a build's step containers inherit
    # the base image's labels without an owner, so any reaper would take them for leftovers.
    with _docker.translate(f"build {tag}"):
        try:
            builder = api.create_container(
                base.tag,
                command=["sh", "-c", _script(kind, version, mirror, suite)],
                user="0:0",
                labels={
                    _docker.LABEL_MANAGED: "1",
                    _docker.LABEL_KIND: "image-builder",
                    _docker.LABEL_OWNER: _owner(),
                },
                host_config=api.create_host_config(network_mode="bridge"),
            )["Id"]
            api.start(builder)
            for chunk in api.logs(builder, stream=True, follow=True):
                for line in chunk.decode("utf-8", "replace").splitlines():
                    if line.strip():
                        tail = [*tail[-19:], line]
                        progress(line)
            status = api.wait(builder).get("StatusCode")
            if status != 0:
                raise WorkstationError(
                    f"building {tag} failed (exit {status}):\n" + "\n".join(tail)
                )
            repository, _, version_tag = tag.rpartition(":")
            api.commit(
                builder,
                repository=repository,
                tag=version_tag,
                conf={
                    "User": user,
                    "WorkingDir": DATA,
                    "Cmd": ["sleep", "infinity"],
                    "Labels": {
                        _docker.LABEL_MANAGED: "1",
                        _docker.LABEL_KIND: "service-image",
                        _docker.LABEL_OWNER: "",
                    },
                },
            )
        finally:
            if builder is not None:
                with contextlib.suppress(_docker.errors.DockerException):
                    api.remove_container(builder, force=True)
    info = images.get(tag)
    if info is None:
        raise WorkstationError(f"the engine did not keep the built image {tag}")
    return info.model_copy(update={"built": True})
