"""Removing volumes and loop-backed workspace images that are no longer used."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from docker import errors

from hybrid.workstation import disk
from hybrid.workstation.docker.engine import client, translate
from hybrid.workstation.docker.labels import LABEL_MANAGED, owner_alive

if TYPE_CHECKING:
    from typing import Any


def _remove_volume(volume: str) -> None:
    """Remove a workspace volume and then the disk image its mount holds."""
    api = client().api
    with translate("remove workspace volume"):
        try:
            mount = disk.mount_of(api.inspect_volume(volume))
        except errors.NotFound:
            return
        with contextlib.suppress(errors.NotFound):
            api.remove_volume(volume, force=True)
    if mount is not None:
        disk.drop(mount)


def disk_gc(api: Any) -> None:
    """Drop workspace disks no volume binds whose creator died (a client killed mid-create)."""
    bound = {
        str(disk.mount_of(v))
        for v in api.volumes(filters={"label": f"{LABEL_MANAGED}=1"}).get("Volumes") or []
    }
    for mount in disk.orphans(owner_alive):
        if str(mount) not in bound:
            disk.drop(mount)


def unlabelled_workspaces(api: Any, in_use: set[str]) -> list[str]:
    """Volumes the engine made on its own, without our labels, that no container uses and that
    bind a workspace disk of this state directory whose creator is gone (or the disk is gone).

    The engine makes one when a container naming a volume is created after that volume was
    removed (a create and its cleanup racing); it repeats the options the mount gave, so it
    binds our disk, but no label-filtered listing finds it."""
    dead = {str(mount) for mount in disk.orphans(owner_alive)}
    found = []
    for volume in api.volumes().get("Volumes") or []:
        if (volume.get("Labels") or {}).get(LABEL_MANAGED) or volume["Name"] in in_use:
            continue
        mount = disk.mount_of(volume)
        if mount is None or mount.parent.parent != disk.root():
            continue
        if str(mount) in dead or not mount.parent.exists():
            found.append(volume["Name"])
    return found
