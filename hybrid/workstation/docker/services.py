"""Service containers of a Docker workstation (a database, a cache), hardened like it.

Topology: the workstation and its services share one network namespace that holds only ``lo``
(the egress relay's, or else a holder container's: ``hybrid-NAME-net``, which only sleeps so
the namespace outlives a workstation the deadline killed). A service listens on 127.0.0.1
there; another workstation, the host and the services themselves have no route to anything
else. Each service runs read-only as its image's own user with every capability dropped,
no-new-privileges, capped pids, memory and CPU, and keeps its data in a size-capped volume.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from docker import errors
from docker.types import DriverConfig
from docker.types import Mount as DockerMount

from hybrid import shield
from hybrid.errors import WorkstationError, WorkstationNotFound
from hybrid.workstation import disk, jobuser
from hybrid.workstation import services as kinds
from hybrid.workstation.base import ServiceInfo
from hybrid.workstation.docker import seccomp
from hybrid.workstation.docker.engine import client, translate
from hybrid.workstation.docker.gc import _remove_volume
from hybrid.workstation.docker.labels import (
    LABEL_KIND,
    LABEL_MANAGED,
    LABEL_NAME,
    LABEL_OWNER,
    LABEL_PERSISTENT,
    LABEL_SERVICE,
    LABEL_SNAPSHOT,
    LABEL_VOLUME,
    owner_alive,
)
from hybrid.workstation.docker.supervision import _Chunks

if TYPE_CHECKING:
    from typing import Any

    import docker

    from hybrid.policy import SandboxSpec, Service
    from hybrid.workstation.base import GcReport

SERVICE_REPOSITORY = "hybrid-service-snapshot"
_HOLDER_USER = jobuser.HELPER_USER  # not nobody's: no host account may signal or trace it
_POLL = 0.1


def holder_name(name: str) -> str:
    return f"hybrid-{name}-net"


def container_name(name: str, key: str) -> str:
    return f"hybrid-{name}-svc-{key}"


def _owned(labels: dict[str, str]) -> dict[str, str]:
    return {
        LABEL_MANAGED: "1",
        LABEL_NAME: labels[LABEL_NAME],
        LABEL_OWNER: labels[LABEL_OWNER],
        LABEL_PERSISTENT: labels[LABEL_PERSISTENT],
    }


def make_holder(labels: dict[str, str]) -> None:
    """The container whose namespace (only ``lo``) the workstation and its services join."""
    from hybrid.workstation.images import BASE_IMAGE

    api = client().api
    holder = api.create_container(
        BASE_IMAGE,
        command=["sleep", "infinity"],
        name=holder_name(labels[LABEL_NAME]),
        hostname="workstation",
        user=_HOLDER_USER,
        labels={**_owned(labels), LABEL_KIND: "netns"},
        network_disabled=True,
        host_config=api.create_host_config(
            network_mode="none",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=seccomp.security_opt(),
            init=True,
            pids_limit=8,
            mem_limit=32 * 1024**2,
            restart_policy={"Name": "unless-stopped"},
        ),
    )["Id"]
    api.start(holder)


def create_all(
    labels: dict[str, str], spec: SandboxSpec, network: str, images: dict[str, str]
) -> None:
    """Create and start every service of ``spec`` in namespace ``network`` (not yet healthy).

    ``images`` names the image of a service by key (a snapshot's, whose data it starts from).
    """
    api = client().api
    for service in spec.services:
        image = images.get(service.key) or kinds.image_of(service)
        try:
            api.inspect_image(image)
        except errors.ImageNotFound:
            hint = (
                f" (build it with: hybrid image bootstrap --service {service.kind})"
                if service.kind != "image"
                else ""
            )
            raise WorkstationNotFound(f"service {service.key}: no image {image}{hint}") from None
        mounts = []
        data = kinds.data_of(service)
        volume = ""
        if data is not None:
            volume = _data_volume(labels, service)
            options = api.inspect_volume(volume).get("Options") or None
            mounts.append(
                DockerMount(
                    data, volume, type="volume", driver_config=DriverConfig("local", options)
                )
            )
        tmp = f"rw,nosuid,nodev,size={min(service.memory, 256 * 1024**2)},mode=1777"
        made = api.create_container(
            image,
            command=kinds.command_of(service),
            name=container_name(labels[LABEL_NAME], service.key),
            environment={**service.env, **kinds.service_env(service)},
            labels={
                **_owned(labels),
                LABEL_KIND: "service",
                LABEL_SERVICE: service.key,
                LABEL_VOLUME: volume,
            },
            host_config=api.create_host_config(
                network_mode=network,
                read_only=True,
                tmpfs={"/tmp": tmp, "/run": tmp},
                mounts=mounts,
                cap_drop=["ALL"],
                security_opt=seccomp.security_opt(),
                pids_limit=service.pids,
                mem_limit=service.memory,
                memswap_limit=service.memory,
                nano_cpus=int(service.cpus * 1e9),
                init=True,
                ipc_mode="private",
                restart_policy={"Name": "unless-stopped"},
            ),
        )["Id"]
        api.start(made)


def _data_volume(labels: dict[str, str], service: Service) -> str:
    name = f"{container_name(labels[LABEL_NAME], service.key)}-data"
    mount = disk.create(name, service.disk, labels[LABEL_OWNER], owner_alive)
    try:
        return str(
            client()
            .api.create_volume(
                name,
                driver="local",
                driver_opts=disk.volume_options(mount),
                labels={**_owned(labels), LABEL_KIND: "service-data"},
            )
            .get("Name")
        )
    except BaseException:
        disk.drop(mount)
        raise


def wait_ready(name: str, spec: SandboxSpec) -> None:
    """Block until every service is healthy (and set up)."""
    api = client().api
    for service in spec.services:
        container = container_name(name, service.key)
        health = kinds.health_of(service)
        deadline = time.time() + service.ready_seconds
        last = ""
        while True:
            state = api.inspect_container(container)["State"]
            logs = api.logs(container, tail=20).decode("utf-8", "replace")
            if not state.get("Running"):
                raise WorkstationError(
                    f"service {service.key} exited ({state.get('ExitCode')}): {logs.strip()[-400:]}"
                )
            if kinds.self_checking(service):
                # Its own shell probes and sets it up, then says so (services.READY).
                if kinds.READY in logs.split():
                    break
                last = logs
            elif health is not None:
                code, last = _run(api, container, health, kinds.service_env(service))
                if code == 0:
                    break
            else:
                break  # kind image without a health check: started is all there is to know
            if time.time() >= deadline:
                raise WorkstationError(
                    f"service {service.key} was not healthy after {service.ready_seconds:g}s "
                    f"(raise ready_seconds): {last.strip()[-300:]}"
                )
            shield.raise_if_cancelled()  # an interrupted create stops waiting here
            time.sleep(_POLL)


def _run(
    api: docker.APIClient, container: str, argv: list[str], env: dict[str, str]
) -> tuple[int | None, str]:
    """Run ``argv`` in a service container: (exit status, output)."""
    try:
        made = api.exec_create(container, argv, environment=env or None)["Id"]
        out = api.exec_start(made)
        return api.exec_inspect(made).get("ExitCode"), out.decode("utf-8", "replace")
    except errors.APIError as exc:
        return None, str(exc.explanation or exc)


def running(name: str) -> list[dict[str, Any]]:
    """The service and holder containers of workstation ``name`` (engine list rows)."""
    rows = client().api.containers(
        all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_NAME}={name}"]}
    )
    return [r for r in rows if (r.get("Labels") or {}).get(LABEL_KIND) in ("service", "netns")]


def remove_all(name: str, report: GcReport | None = None) -> None:
    """Remove workstation ``name``'s services, their data volumes and its namespace holder."""
    api = client().api
    with translate(f"remove the services of {name}"):
        volumes = []
        for row in running(name):
            labels = row.get("Labels") or {}
            with contextlib.suppress(errors.NotFound):
                api.remove_container(row["Id"], force=True)
                if report is not None:
                    report.containers.append((row.get("Names") or [row["Id"][:12]])[0].lstrip("/"))
            if labels.get(LABEL_VOLUME):
                volumes.append(labels[LABEL_VOLUME])
        found = api.volumes(
            filters={"label": [f"{LABEL_NAME}={name}", f"{LABEL_KIND}=service-data"]}
        )
        volumes += [v["Name"] for v in found.get("Volumes") or []]
        for volume in dict.fromkeys(volumes):
            with contextlib.suppress(WorkstationError):
                _remove_volume(volume)
                if report is not None:
                    report.volumes.append(volume)


def infos(name: str, spec: SandboxSpec) -> list[ServiceInfo]:
    """What `ws ls` shows about workstation ``name``'s services."""
    rows = {
        (r.get("Labels") or {}).get(LABEL_SERVICE): r
        for r in running(name)
        if (r.get("Labels") or {}).get(LABEL_KIND) == "service"
    }
    return [
        ServiceInfo(
            name=s.key,
            kind=s.kind,
            image=str(rows[s.key].get("Image")) if s.key in rows else kinds.image_of(s),
            port=kinds.port_of(s),
            status=str(rows[s.key].get("State", "")) if s.key in rows else "missing",
        )
        for s in spec.services
    ]


# -- snapshots ------------------------------------------------------------------------------------


def snapshot_all(name: str, spec: SandboxSpec, snapshot: str, owner: str) -> dict[str, str]:
    """Commit each service with its data as an image; returns {service: image}."""
    made: dict[str, str] = {}
    try:
        for service in spec.services:
            data = kinds.data_of(service)
            if data is None:
                continue
            made[service.key] = _snapshot_one(name, service, data, snapshot, owner)
    except BaseException:
        for image in made.values():
            with contextlib.suppress(errors.DockerException):
                client().api.remove_image(image, force=True)
        raise
    return made


def _snapshot_one(name: str, service: Service, data: str, snapshot: str, owner: str) -> str:
    api = client().api
    container = container_name(name, service.key)
    attrs = api.inspect_container(container)
    flush = kinds.flush_of(service)
    if flush is not None and attrs["State"].get("Running"):
        _run(api, container, flush, kinds.service_env(service))  # best effort: still consistent
    image = attrs["Config"]["Image"]
    user = attrs["Config"].get("User") or ""
    # The builder empties the image's copy of the data first, so files the service deleted
    # since do not come back from below.
    builder = api.create_container(
        image,
        command=["find", data, "-mindepth", "1", "-delete"],
        entrypoint=[],
        user=user,
        labels={LABEL_MANAGED: "1", LABEL_KIND: "snapshot-builder", LABEL_OWNER: owner},
        network_disabled=True,
        host_config=api.create_host_config(network_mode="none"),
    )["Id"]
    try:
        api.start(builder)
        if api.wait(builder, timeout=120).get("StatusCode") != 0:
            raise WorkstationError(f"service {service.key}: could not prepare its snapshot")
        # Frozen while its data is read: the copy is one moment (what a power cut would leave,
        # which a database recovers from by design).
        paused = False
        with contextlib.suppress(errors.APIError):
            api.pause(container)
            paused = True
        try:
            chunks, _ = api.get_archive(container, data)
            api.put_archive(builder, str(PurePosixPath(data).parent), _Chunks(chunks))
        finally:
            if paused:
                api.unpause(container)
        tag = f"{snapshot}.{service.key}"
        return str(
            api.commit(
                builder,
                repository=SERVICE_REPOSITORY,
                tag=tag,
                conf={
                    "Labels": {
                        LABEL_MANAGED: "1",
                        LABEL_KIND: "service-snapshot",
                        LABEL_SNAPSHOT: snapshot,
                        LABEL_SERVICE: service.key,
                    },
                    "Cmd": attrs["Config"].get("Cmd"),
                    "User": user,
                },
            )["Id"]
        )
    finally:
        with contextlib.suppress(errors.DockerException):
            api.remove_container(builder, force=True)


def images_of(labels: dict[str, str]) -> dict[str, str]:
    """{service: image} recorded on a snapshot (empty for one without services)."""
    from hybrid.workstation.docker.labels import LABEL_SERVICES

    with contextlib.suppress(ValueError, TypeError):
        found = json.loads(labels.get(LABEL_SERVICES) or "{}")
        return {str(k): str(v) for k, v in found.items()}
    return {}


def drop_snapshots(snapshot: str | None = None, report: GcReport | None = None) -> None:
    """Remove the service images of ``snapshot`` (None: of every snapshot that is gone) that no
    container runs from."""
    from hybrid.workstation.docker.labels import SNAPSHOT_REPOSITORY

    api = client().api
    filters = [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}=service-snapshot"]
    if snapshot is not None:
        filters.append(f"{LABEL_SNAPSHOT}={snapshot}")
    used = {row.get("ImageID") for row in api.containers(all=True)}
    for row in api.images(all=True, filters={"label": filters}):
        parent = (row.get("Labels") or {}).get(LABEL_SNAPSHOT, "")
        if row["Id"] in used:
            continue
        if snapshot is None:
            with contextlib.suppress(errors.ImageNotFound):
                api.inspect_image(f"{SNAPSHOT_REPOSITORY}:{parent}")
                continue  # its snapshot still exists
        with contextlib.suppress(errors.APIError):
            api.remove_image(row["Id"], force=True)
            if report is not None:
                report.images.append(f"{parent}.{(row.get('Labels') or {}).get(LABEL_SERVICE)}")
