"""Makes, finds, snapshots and cleans up Docker workstations."""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from docker import errors
from docker.types import DriverConfig, LogConfig
from docker.types import Mount as DockerMount

from hybrid.deps import layers as deps_layers
from hybrid.errors import PolicyViolation, WorkstationError, WorkstationNotFound
from hybrid.policy import SandboxSpec, admit, check_input_path, for_workstation
from hybrid.shield import shielded
from hybrid.tiers.container import tier_of
from hybrid.workstation import disk, jobuser, state
from hybrid.workstation.base import GcReport, check_image, check_name
from hybrid.workstation.baseline import Baseline
from hybrid.workstation.docker import seccomp, services
from hybrid.workstation.docker.egress import _EGRESS_LOG_SIZE, _EGRESS_USER
from hybrid.workstation.docker.engine import client, translate
from hybrid.workstation.docker.gc import _remove_volume, disk_gc, unlabelled_workspaces
from hybrid.workstation.docker.labels import (
    DEFAULT_USER,
    LABEL_BASE,
    LABEL_DISK,
    LABEL_EPHEMERAL,
    LABEL_KIND,
    LABEL_MANAGED,
    LABEL_NAME,
    LABEL_NETWORK,
    LABEL_OWNER,
    LABEL_PERSISTENT,
    LABEL_RUNTIME,
    LABEL_SNAPSHOT,
    LABEL_SNAPSHOT_OF,
    LABEL_SPEC,
    LABEL_VOLUME,
    SNAPSHOT_REPOSITORY,
    _base_env,
    _host_pids,
    _info,
    _owner,
    _owner_ids,
    _snapshot_info,
    owner_alive,
    runtime_for,
)
from hybrid.workstation.docker.workstation import DockerWorkstation

if TYPE_CHECKING:
    import builtins
    from typing import Any

    import docker

    from hybrid.workstation.base import SnapshotInfo, WorkstationInfo


class DockerBackend:
    """Makes, finds and cleans up Docker workstations (runc or runsc per spec)."""

    def __init__(self, user: str = DEFAULT_USER) -> None:
        self.user = user

    def create(
        self,
        spec: SandboxSpec | None = None,
        *,
        image: str | None = None,
        repo: Path | None = None,
        name: str | None = None,
        persistent: bool = False,
        snapshot_of: str | None = None,
        lifetime: float | None = None,
        service_images: dict[str, str] | None = None,
    ) -> DockerWorkstation:
        """A new hardened workstation from ``image`` (default the base image) with ``repo`` copied in.

        ``lifetime`` (seconds, for one-shot sandboxes) makes the engine itself end the container
        then, client or no client: its PID 1 is a plain ``sleep``, which nothing inside can
        signal or stop (a namespace's init ignores signals it has no handler for).
        The spec's services are healthy before this returns; ``service_images`` ({service:
        image}) starts them from a snapshot's data.
        """
        from hybrid.workstation.images import BASE_IMAGE

        check_image(image)
        jobuser.check()
        seccomp.profile()  # no profile: refused before anything is made
        jobuser.refuse_host_ids(*_owner_ids(self.user), "a workstation of this backend")
        spec = spec or for_workstation(SandboxSpec(tier="docker"))
        runtime = runtime_for(spec)
        tier = tier_of(runtime)
        violations = admit(spec, tier)
        if violations:
            raise PolicyViolation(violations)
        if repo is not None:
            # A repository is an input the user named: the same secret-path rule as a mount.
            check_input_path(repo, "repository")
        name = check_name(name or f"ws-{secrets.token_hex(4)}")
        ws = shielded(
            lambda: self._make(
                spec, image or BASE_IMAGE, name, persistent, snapshot_of, lifetime, service_images
            ),
            undo=lambda made: made.remove(),
        )
        if repo is not None:
            try:
                ws.copy_repo(Path(repo))
            except BaseException:
                ws.remove()
                raise
        return ws

    def _make(
        self,
        spec: SandboxSpec,
        image: str,
        name: str,
        persistent: bool,
        snapshot_of: str | None,
        lifetime: float | None,
        service_images: dict[str, str] | None,
    ) -> DockerWorkstation:
        """The engine work of ``create`` (shielded from interrupts): all of it made, or none."""
        from hybrid.workstation.images import BASE_IMAGE

        runtime = runtime_for(spec)
        tier = tier_of(runtime)
        # Labels are engine metadata (inspect, events, images): they get the spec without values.
        spec, secret_env = state.split_env(spec)
        api = client().api
        with translate(f"create {name}"):
            try:
                image_attrs = api.inspect_image(image)
            except errors.ImageNotFound:
                hint = " (build it with: hybrid image bootstrap)" if image == BASE_IMAGE else ""
                raise WorkstationNotFound(f"no image {image}{hint}") from None
            image_labels = image_attrs.get("Config", {}).get("Labels") or {}
            base = image_labels.get(LABEL_BASE) or image
            labels = {
                LABEL_MANAGED: "1",
                LABEL_KIND: "workstation",
                LABEL_NAME: name,
                LABEL_PERSISTENT: "1" if persistent else "0",
                LABEL_OWNER: _owner(),
                LABEL_SPEC: spec.model_dump_json(),
                LABEL_RUNTIME: runtime,
                LABEL_VOLUME: f"hybrid-{name}-workspace",
                LABEL_BASE: base,
                LABEL_SNAPSHOT_OF: snapshot_of or "",
                LABEL_NETWORK: (
                    f"container:hybrid-{name}-relay"
                    if spec.network.mode == "egress"
                    else f"container:{services.holder_name(name)}"
                    if spec.services
                    else ""
                ),
            }
            if api.containers(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_NAME}={name}"]}
            ):
                raise WorkstationError(
                    f"a workstation named {name} exists; pick another name or remove it"
                )
            volume, labels[LABEL_DISK] = self._workspace_volume(labels, spec, tier)
            container_id = None
            try:
                if spec.network.mode == "egress":
                    self._egress(labels, spec)
                elif labels[LABEL_NETWORK]:
                    services.make_holder(labels)
                if spec.services:
                    # Healthy before the workstation exists: a client killed meanwhile leaves only
                    # services without a workstation, which gc removes even when persistent.
                    services.create_all(labels, spec, labels[LABEL_NETWORK], service_images or {})
                    services.wait_ready(name, spec)
                # An image of ours already holds a /workspace of its user; one built for other
                # ids (before jobs had their own) has it handed over like any other image's.
                if (
                    image_labels.get(LABEL_KIND) not in ("base", "snapshot", "deps")
                    or spec.workspace != "/workspace"
                    or _workspace_user(api, image_attrs) != self.user
                ):
                    self._own_workspace(image, volume, spec)
                host_config = self._host_config(spec, runtime, volume, labels[LABEL_NETWORK])
                if lifetime is not None:
                    # Under docker-init, sleep would be its child, which the sandbox's user can stop.
                    host_config["Init"] = False
                container_id = api.create_container(
                    image,
                    command=["sleep", "infinity" if lifetime is None else f"{math.ceil(lifetime)}"],
                    name=f"hybrid-{name}",
                    # A joined namespace brings its own hostname (the relay's, "workstation").
                    hostname=None if labels[LABEL_NETWORK] else "workstation",
                    user=self.user,
                    working_dir=spec.workspace,
                    environment=_base_env(spec),
                    labels=labels,
                    network_disabled=not labels[LABEL_NETWORK],
                    host_config=host_config,
                )["Id"]
                if secret_env:
                    state.save_env(state.directory("workstations", container_id), secret_env)
                api.start(container_id)
                ws = DockerWorkstation(client().containers.get(container_id), self)
            except BaseException:
                if container_id is not None:
                    with contextlib.suppress(errors.DockerException):
                        api.remove_container(container_id, force=True)
                    state.forget("workstations", container_id)
                with contextlib.suppress(errors.DockerException):
                    api.remove_volume(volume, force=True)
                disk.drop(Path(labels[LABEL_DISK]))
                self._remove_egress(name)
                if labels[LABEL_NETWORK]:
                    with contextlib.suppress(WorkstationError):
                        services.remove_all(name)
                raise
        return ws

    def _workspace_volume(
        self, labels: dict[str, str], spec: SandboxSpec, tier: str
    ) -> tuple[str, str]:
        """The workspace volume, bound to a size-capped mount (see disk.py): (volume, mount)."""
        name = labels[LABEL_VOLUME]
        mount = disk.create(name, spec.budget.disk_for(tier), labels[LABEL_OWNER], owner_alive)
        try:
            created = client().api.create_volume(
                name,
                driver="local",
                driver_opts=disk.volume_options(mount),
                labels={
                    LABEL_MANAGED: "1",
                    LABEL_KIND: "workspace",
                    LABEL_NAME: labels[LABEL_NAME],
                    LABEL_OWNER: labels[LABEL_OWNER],  # gc leaves a live create's volume alone
                },
            )["Name"]
        except BaseException:
            disk.drop(mount)
            raise
        return str(created), str(mount)

    def _egress(self, labels: dict[str, str], spec: SandboxSpec) -> None:
        # Three pieces, so the workstation reaches the proxy and nothing else: a relay container
        # with no network (only lo) whose namespace the workstation joins, forwarding
        # 127.0.0.1:PORT to a unix socket in a tmpfs volume; and the proxy on the default
        # bridge serving that socket. A Docker network would give the host an address (and a
        # default route) the workstation could use; a namespace with only lo has none.
        from hybrid.workstation import proxy
        from hybrid.workstation.images import BASE_IMAGE

        api = client().api
        name = labels[LABEL_NAME]
        owned = {
            LABEL_MANAGED: "1",
            LABEL_NAME: name,
            LABEL_OWNER: labels[LABEL_OWNER],
            LABEL_PERSISTENT: labels[LABEL_PERSISTENT],
        }
        uid, gid = jobuser.HELPER_UID, jobuser.HELPER_GID
        volume = api.create_volume(
            f"hybrid-{name}-egress",
            driver="local",
            driver_opts={
                "type": "tmpfs",
                "device": "tmpfs",
                "o": f"uid={uid},gid={gid},mode=0700,size=64k",
            },
            labels={**owned, LABEL_KIND: "egress"},
        )["Name"]
        source = Path(proxy.__file__).read_text(encoding="utf-8")
        socket_dir = [DockerMount(proxy.SOCKET_DIR, volume, type="volume")]

        def hardened(**extra: Any) -> dict[str, Any]:
            return dict(
                api.create_host_config(
                    read_only=True,
                    cap_drop=["ALL"],
                    security_opt=seccomp.security_opt(),
                    init=True,
                    mounts=socket_dir,
                    restart_policy={"Name": "unless-stopped"},
                    **extra,
                )
            )

        deny = self._host_addresses(source, labels[LABEL_OWNER])
        helper = api.create_container(
            BASE_IMAGE,
            command=["python3", "-c", source, "serve"],
            name=f"hybrid-{name}-proxy",
            user=_EGRESS_USER,
            environment={
                "HYBRID_ALLOW": json.dumps(spec.network.allow),
                "HYBRID_DENY": json.dumps(deny),
            },
            labels={**owned, LABEL_KIND: "proxy"},
            host_config=hardened(
                network_mode="bridge",
                pids_limit=64,
                mem_limit=128 * 1024**2,
                # The request log: the engine keeps it, capped, where the workstation cannot write.
                log_config=LogConfig(
                    type="json-file", config={"max-size": _EGRESS_LOG_SIZE, "max-file": "2"}
                ),
            ),
        )["Id"]
        api.start(helper)
        relay = api.create_container(
            BASE_IMAGE,
            command=["python3", "-c", source, "relay"],
            name=labels[LABEL_NETWORK].removeprefix("container:"),
            hostname="workstation",
            user=_EGRESS_USER,
            labels={**owned, LABEL_KIND: "relay"},
            network_disabled=True,
            host_config=hardened(network_mode="none", pids_limit=32, mem_limit=64 * 1024**2),
        )["Id"]
        api.start(relay)

    def _host_addresses(self, source: str, owner: str) -> list[str]:
        # The proxy must refuse the host's own addresses, global ones included; only a process
        # in the host's network namespace can list them (and this works for a remote engine).
        from hybrid.workstation.images import BASE_IMAGE

        api = client().api
        helper = api.create_container(
            BASE_IMAGE,
            command=["python3", "-c", source, "addresses"],
            user=_EGRESS_USER,
            labels={LABEL_MANAGED: "1", LABEL_KIND: "helper", LABEL_OWNER: owner},
            host_config=api.create_host_config(
                network_mode="host",
                read_only=True,
                cap_drop=["ALL"],
                security_opt=seccomp.security_opt(),
                pids_limit=16,
                mem_limit=64 * 1024**2,
            ),
        )["Id"]
        try:
            api.start(helper)
            status = api.wait(helper, timeout=60)
            out = api.logs(helper, stdout=True, stderr=False)
            if status.get("StatusCode") != 0:
                raise WorkstationError("could not list the host's addresses for the egress proxy")
            return [str(a) for a in json.loads(out)]
        finally:
            with contextlib.suppress(errors.DockerException):
                api.remove_container(helper, force=True)

    def _remove_egress(self, name: str, report: GcReport | None = None) -> None:
        """Remove workstation ``name``'s relay, proxy and socket volume (recorded in ``report``)."""
        api = client().api
        for container in (f"hybrid-{name}-relay", f"hybrid-{name}-proxy"):
            with contextlib.suppress(errors.DockerException):
                api.remove_container(container, force=True)
                if report is not None:
                    report.containers.append(container)
        with contextlib.suppress(errors.DockerException):
            api.remove_volume(f"hybrid-{name}-egress", force=True)
            if report is not None:
                report.volumes.append(f"hybrid-{name}-egress")
        with contextlib.suppress(errors.DockerException):
            api.remove_network(f"hybrid-{name}-net")  # made by earlier versions

    def _host_config(
        self, spec: SandboxSpec, runtime: str, volume: str, network: str = ""
    ) -> dict[str, Any]:
        budget = spec.budget
        mounts = [_workspace_mount(spec.workspace, volume)]
        mounts += [
            DockerMount(
                m.target,
                str(m.source.expanduser().resolve()),
                type="bind",
                read_only=m.mode == "ro",
            )
            for m in spec.mounts
        ]
        tmp_size = min(budget.memory, 1024**3)
        config: dict[str, Any] = client().api.create_host_config(
            runtime=runtime,
            network_mode=network or "none",
            read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={tmp_size},mode=1777"},
            mounts=mounts,
            cap_drop=["ALL"],
            security_opt=seccomp.security_opt(),
            pids_limit=_host_pids(budget.pids, runtime),
            mem_limit=budget.memory,
            memswap_limit=budget.memory,
            nano_cpus=int(budget.cpus * 1e9),
            init=True,
            ipc_mode="private",
        )
        return config

    def _own_workspace(self, image: str, volume: str, spec: SandboxSpec) -> None:
        # An empty volume takes the owner of whatever sits at its path in the image (root, or a
        # directory the engine makes). Let a one-off container holding CAP_CHOWN (and
        # CAP_DAC_OVERRIDE) and nothing else
        # take that first mount (so any image content is copied up), hand it all to the user and
        # leave it non-empty, so the workstation's own mount copies nothing over it.
        api = client().api
        target = shlex.quote(spec.workspace)
        helper = api.create_container(
            image,
            command=["sh", "-c", f"mkdir -p {target}/.hybrid && chown -R {self.user} {target}"],
            user="0:0",
            labels={LABEL_MANAGED: "1", LABEL_KIND: "helper", LABEL_OWNER: _owner()},
            network_disabled=True,
            host_config=api.create_host_config(
                network_mode="none",
                read_only=True,
                cap_drop=["ALL"],
                # DAC_OVERRIDE: the image's /workspace may belong to another user already (one
                # built for other ids), and root without it cannot write there.
                cap_add=["CHOWN", "DAC_OVERRIDE"],
                security_opt=seccomp.security_opt(),
                mounts=[_workspace_mount(spec.workspace, volume)],
            ),
        )["Id"]
        try:
            api.start(helper)
            status = api.wait(helper, timeout=60)
            if status.get("StatusCode") != 0:
                raise WorkstationError(
                    f"could not give {spec.workspace} to user {self.user} in image {image}"
                )
        finally:
            with contextlib.suppress(errors.DockerException):
                api.remove_container(helper, force=True)

    def start(
        self,
        snapshot: str,
        *,
        spec: SandboxSpec | None = None,
        name: str | None = None,
        persistent: bool = False,
    ) -> DockerWorkstation:
        """A new workstation starting from snapshot ``snapshot`` (its files and packages)."""
        info = self.snapshot_info(snapshot)
        with translate(f"snapshot {snapshot}"):
            labels = client().api.inspect_image(info.image)["Config"]["Labels"] or {}
        if spec is None:
            spec = SandboxSpec.model_validate_json(labels[LABEL_SPEC])
        # The image's spec names its env.set variables; their values are in host-side state.
        spec = state.with_values(spec, state.load_env(state.path("snapshots", info.id)))
        made = self.create(
            spec,
            image=info.image,
            name=name,
            persistent=persistent,
            snapshot_of=snapshot,
            service_images=services.images_of(labels),
        )
        try:
            Baseline.of("snapshots", info.id).copy_to(made.baseline())
        except BaseException:
            made.remove()
            raise
        return made

    def open(self, name: str) -> DockerWorkstation:
        """An existing workstation by name."""
        with translate(f"find {name}"):
            found = client().containers.list(
                all=True,
                filters={
                    "label": [
                        f"{LABEL_MANAGED}=1",
                        f"{LABEL_KIND}=workstation",
                        f"{LABEL_NAME}={name}",
                    ]
                },
            )
        if not found:
            raise WorkstationNotFound(f"no workstation named {name} (see: hybrid ws ls)")
        return DockerWorkstation(found[0], self)

    def list(self) -> builtins.list[WorkstationInfo]:
        """Every workstation this toolkit made on the engine."""
        api = client().api
        with translate("list workstations"):
            rows = api.containers(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}=workstation"]}
            )
            return sorted(
                (_info(api.inspect_container(row["Id"])) for row in rows), key=lambda i: i.name
            )

    def snapshot_info(self, name: str) -> SnapshotInfo:
        """The snapshot called ``name``."""
        ref = f"{SNAPSHOT_REPOSITORY}:{check_name(name)}"
        with translate(f"snapshot {name}"):
            try:
                attrs = client().api.inspect_image(ref)
            except errors.ImageNotFound:
                raise WorkstationNotFound(f"no snapshot named {name}") from None
        return _snapshot_info(name, attrs)

    def snapshots(self) -> builtins.list[SnapshotInfo]:
        """Every snapshot this toolkit made."""
        api = client().api
        with translate("list snapshots"):
            images = api.images(filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}=snapshot"]})
            found = []
            for row in images:
                attrs = api.inspect_image(row["Id"])
                name = (attrs["Config"].get("Labels") or {}).get(LABEL_SNAPSHOT, "")
                if f"{SNAPSHOT_REPOSITORY}:{name}" in (attrs.get("RepoTags") or []):
                    found.append(_snapshot_info(name, attrs))
        return sorted(found, key=lambda s: s.name)

    def remove_snapshot(self, name: str) -> None:
        """Delete snapshot ``name`` (its image stays while a workstation still runs from it)."""
        info = self.snapshot_info(name)
        with translate(f"remove snapshot {name}"), contextlib.suppress(errors.APIError):
            client().api.remove_image(info.image, noprune=False)
            state.forget("snapshots", info.id)
        with translate(f"remove the services of snapshot {name}"):
            services.drop_snapshots(name)

    def _gc_egress(self, everything: bool, report: GcReport) -> None:
        # A relay or proxy whose workstation is gone (a crash between removals, or a
        # persistent workstation removed by hand) and whose maker no longer runs (it may still
        # be creating the workstation).
        api = client().api
        names = {
            (row.get("Labels") or {}).get(LABEL_NAME)
            for row in api.containers(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}=workstation"]}
            )
        }
        for kind in ("relay", "proxy", "netns", "service"):
            for row in api.containers(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}={kind}"]}
            ):
                labels = row.get("Labels") or {}
                if labels.get(LABEL_NAME) in names and not everything:
                    continue
                if not everything and owner_alive(labels.get(LABEL_OWNER, "")):
                    continue
                with contextlib.suppress(errors.NotFound):
                    api.remove_container(row["Id"], force=True)
                    report.containers.append((row.get("Names") or [row["Id"][:12]])[0].lstrip("/"))

    def remove_container(self, container_id: str, volume: str | None) -> None:
        shielded(lambda: self._remove_container(container_id, volume))

    def _remove_container(self, container_id: str, volume: str | None) -> None:
        api = client().api
        image = None
        labels: dict[str, str] = {}
        with translate("remove workstation"), contextlib.suppress(errors.NotFound):
            attrs = api.inspect_container(container_id)
            image = attrs["Config"]["Image"]
            labels = attrs["Config"].get("Labels") or {}
            api.remove_container(container_id, force=True)
        if labels.get(LABEL_NETWORK):
            self._remove_egress(labels[LABEL_NAME])
            services.remove_all(labels[LABEL_NAME])
        if volume:
            _remove_volume(volume)
        state.forget("workstations", container_id)
        if image and image.startswith(f"{SNAPSHOT_REPOSITORY}:"):
            self._drop_if_ephemeral(image)

    def _drop_if_ephemeral(self, image: str) -> None:
        api = client().api
        with contextlib.suppress(errors.DockerException):
            attrs = api.inspect_image(image)
            labels = attrs["Config"].get("Labels") or {}
            if labels.get(LABEL_EPHEMERAL) == "1" and not api.containers(
                all=True, filters={"ancestor": image}
            ):
                api.remove_image(image)
                state.forget("snapshots", attrs["Id"])
                services.drop_snapshots(labels.get(LABEL_SNAPSHOT, ""))

    def reap(self) -> GcReport:
        """Remove what dead clients left: their non-persistent containers with their volumes and
        networks. Cheaper and narrower than ``gc``: nothing a live process may still be making."""
        report = GcReport()
        with translate("reap"):
            self._reap(client().api, report, everything=False)
        return report

    def _reap(self, api: docker.APIClient, report: GcReport, everything: bool) -> None:
        for row in api.containers(all=True, filters={"label": f"{LABEL_MANAGED}=1"}):
            labels = row.get("Labels") or {}
            abandoned = labels.get(LABEL_PERSISTENT) != "1" and not owner_alive(
                labels.get(LABEL_OWNER, "")
            )
            if not (everything or abandoned):
                continue
            # APIError too: another process may be reaping the same leftovers right now.
            with contextlib.suppress(errors.APIError):
                api.remove_container(row["Id"], force=True)
                shown = (row.get("Names") or [row["Id"][:12]])[0].lstrip("/")
                if labels.get(LABEL_KIND) == "workstation":
                    shown = labels.get(LABEL_NAME) or shown
                report.containers.append(shown)
            if labels.get(LABEL_KIND) != "workstation":
                continue
            state.forget("workstations", row["Id"])
            if labels.get(LABEL_VOLUME):
                with contextlib.suppress(WorkstationError):
                    _remove_volume(labels[LABEL_VOLUME])
                    report.volumes.append(labels[LABEL_VOLUME])
            if labels.get(LABEL_NETWORK):
                self._remove_egress(labels.get(LABEL_NAME, ""), report)
                with contextlib.suppress(WorkstationError):
                    services.remove_all(labels.get(LABEL_NAME, ""), report)

    def gc(self, everything: bool = False) -> GcReport:
        """Remove what crashed clients left: their scoped containers, orphan volumes, fork snapshots.

        ``everything`` also removes persistent workstations and snapshots (never the base image).
        """
        api = client().api
        report = GcReport()
        with translate("gc"):
            self._reap(api, report, everything)
            self._gc_egress(everything, report)
            in_use = {
                m.get("Name")
                for row in api.containers(all=True)
                for m in row.get("Mounts") or []
                if m.get("Type") == "volume"
            }
            for volume in api.volumes(filters={"label": f"{LABEL_MANAGED}=1"}).get("Volumes") or []:
                creating = owner_alive((volume.get("Labels") or {}).get(LABEL_OWNER, ""))
                if volume["Name"] not in in_use and not creating:
                    # A container may take it between the listing and here: then it stays.
                    with contextlib.suppress(WorkstationError):
                        _remove_volume(volume["Name"])
                        report.volumes.append(volume["Name"])
            for name in unlabelled_workspaces(api, in_use):
                with contextlib.suppress(WorkstationError):
                    _remove_volume(name)
                    report.volumes.append(name)
            disk_gc(api)
            deps_layers.gc(api, report)  # untagged dependency layers, stale staging
            for network in api.networks(filters={"label": f"{LABEL_MANAGED}=1"}):
                attached = api.inspect_network(network["Id"]).get("Containers") or {}
                if not attached:
                    with contextlib.suppress(errors.NotFound):
                        api.remove_network(network["Id"])
                        report.networks.append(network["Name"])
            used_images = {row.get("ImageID") for row in api.containers(all=True)}
            for row in api.images(
                all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}=snapshot"]}
            ):
                labels = row.get("Labels") or {}
                dangling = not row.get("RepoTags") or row.get("RepoTags") == ["<none>:<none>"]
                if row["Id"] in used_images:
                    continue
                if everything or dangling or labels.get(LABEL_EPHEMERAL) == "1":
                    with contextlib.suppress(errors.APIError):
                        api.remove_image(row["Id"], force=True)
                        state.forget("snapshots", row["Id"])
                        report.images.append(labels.get(LABEL_SNAPSHOT) or row["Id"][7:19])
            services.drop_snapshots(None, report)  # of snapshots that are gone
            # Host-side state (diff baselines) of workstations and snapshots that are gone.
            state.prune("workstations", {row["Id"] for row in api.containers(all=True)})
            state.prune("snapshots", {row["Id"] for row in api.images(all=True)})
        return report


def _workspace_mount(target: str, volume: str) -> DockerMount:
    # The volume's own options repeated: if it vanished before the container is made (a
    # concurrent gc), the engine re-creates it bound to the same capped mount, never a plain one.
    options = client().api.inspect_volume(volume).get("Options") or None
    return DockerMount(target, volume, type="volume", driver_config=DriverConfig("local", options))


def _workspace_user(api: Any, image_attrs: dict[str, Any]) -> str | None:
    """Whose ``/workspace`` an image of ours holds: its user's, but a dependency layer's is its
    base image's (the layer builder never touches it), which may be built for other ids."""
    from docker.errors import DockerException

    from hybrid.deps.layers import KIND, LABEL_IMAGE

    config = image_attrs.get("Config") or {}
    labels = config.get("Labels") or {}
    if labels.get(LABEL_KIND) == KIND and labels.get(LABEL_IMAGE):
        try:
            config = api.inspect_image(labels[LABEL_IMAGE]).get("Config") or {}
        except DockerException:  # the base is gone: hand the workspace over to be sure
            return None
    user = config.get("User")
    return user if isinstance(user, str) else None
