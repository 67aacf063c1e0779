"""Size-capped workspaces: one sparse ext4 image per workstation, loop-mounted on the host.

Docker's local volume driver has no size option on ext4 (and its ``o=loop`` is not honoured by
engine 20.10), a sized tmpfs loses the files when the container stops, and project quotas need
the engine's filesystem remounted. So each workspace is a sparse file of ``budget.disk`` bytes
formatted as ext4 (no journal, nothing reserved) and mounted
``nosuid,nodev,discard`` under the host state directory; the workspace volume binds that mount.
The image can never take more host disk than its size, deleted files give their blocks back
(discard punches holes), and a full workspace fails writes inside with ENOSPC.

Layout, one directory per volume: ``<state>/workspaces/<volume>/{disk.img,mnt/,owner}``. The
volume's ``device`` option names the mount, so removal finds the image whatever process made it;
``owner`` lets ``gc`` tell a create in progress from one a killed client left behind. The bare
``mnt`` directory is mode 000: if the mount is ever missing (a host reboot), the workspace is an
unwritable empty directory, never an uncapped one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from hybrid.errors import EngineUnavailable, InvalidInput, WorkstationError
from hybrid.paths import state_dir
from hybrid.policy import human_size
from hybrid.results import Termination

MIN_SIZE = 16 * 1024**2
"""The smallest workspace: below this ext4's own metadata leaves too little room to be useful."""

_IMAGE, _MOUNT, _OWNER = "disk.img", "mnt", "owner"
_MKFS = ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal"]
_MOUNT_OPTIONS = "loop,discard,nosuid,nodev"
_ENOSPC_TEXT = ("No space left on device", "Disk quota exceeded")


def root() -> Path:
    """Where this process keeps its workspace images (under the host state directory)."""
    return state_dir("workspaces")


def create(volume: str, size: int, made_by: str, alive: Callable[[str], bool]) -> Path:
    """Format and mount a ``size``-byte workspace for ``volume``; return the mount point.

    ``made_by`` is the creating process (``alive(made_by)`` says whether it still runs): a
    leftover of a dead creator under the same name is dropped first. Raises InvalidInput for a
    size below MIN_SIZE and EngineUnavailable where the host cannot loop-mount (not root, no
    mkfs.ext4); nothing is left behind on failure.
    """
    if size < MIN_SIZE:
        raise InvalidInput(
            f"budget.disk: {human_size(size)} is below a workspace's minimum of {human_size(MIN_SIZE)}"
        )
    if os.geteuid() != 0:
        raise EngineUnavailable(
            "a size-capped workspace needs root on the engine's host (it loop-mounts an ext4 image)"
        )
    home = root() / volume
    try:
        home.mkdir(mode=0o700)
    except FileExistsError:
        owner = _owner(home)
        if owner and alive(owner):
            raise WorkstationError(
                f"{volume}: another process is creating this workspace"
            ) from None
        drop(home / _MOUNT)
        home.mkdir(mode=0o700)
    try:
        (home / _OWNER).write_text(made_by)
        image, mount = home / _IMAGE, home / _MOUNT
        mount.mkdir(mode=0)
        with open(image, "wb") as handle:
            handle.truncate(size)
        # Root-owned and empty, like a fresh volume: the engine copies the image's files and the
        # directory's owner in at first start (or _own_workspace hands it to the user).
        _run([*_MKFS, "-E", "root_owner=0:0,lazy_itable_init=1,nodiscard", str(image)])
        _run(["mount", "-o", _MOUNT_OPTIONS, str(image), str(mount)])
        (mount / "lost+found").rmdir()  # an empty root, so the engine copies the image's files in
        return mount
    except BaseException:
        drop(home / _MOUNT)
        raise


def volume_options(mount: Path) -> dict[str, str]:
    """Local-driver options for a volume that binds the mounted workspace."""
    return {"type": "none", "o": "bind", "device": str(mount)}


def mount_of(volume_attrs: dict[str, object]) -> Path | None:
    """The workspace mount a volume binds, if it is one of ours."""
    options = volume_attrs.get("Options") or {}
    device = options.get("device") if isinstance(options, dict) else None
    if not device:
        return None
    mount = Path(str(device))
    if mount.name != _MOUNT or mount.parent.parent.name != "workspaces":
        return None
    return mount


def drop(mount: Path) -> None:
    """Unmount a workspace and delete its image (idempotent; never touches other paths)."""
    home = mount.parent
    if mount.name != _MOUNT or not home.is_dir():
        return
    if os.path.ismount(mount):
        for argv in (["umount", str(mount)], ["umount", "-l", str(mount)]):
            if subprocess.run(argv, capture_output=True).returncode == 0:
                break
    if os.path.ismount(mount):
        return  # still held: gc retries; deleting through a live mount would be wrong
    shutil.rmtree(home, ignore_errors=True)


def orphans(alive: Callable[[str], bool]) -> list[Path]:
    """Mounts in this state directory whose creator died before their volume existed or was
    removed; ``alive(owner) -> bool`` says whether an owner string is a live process."""
    found = []
    with contextlib.suppress(OSError):
        for home in root().iterdir():
            owner = _owner(home)
            if not (owner and alive(owner)):
                found.append(home / _MOUNT)
    return found


def classify(
    mount: str | None,
    size: int,
    termination: Termination,
    detail: str,
    stderr: bytes,
) -> tuple[Termination, str]:
    """DISK_LIMIT for a failed command whose workspace is full or that reported ENOSPC.

    A failed command on a full workspace (under 1% or 1 MiB free, or no inode left) hit its cap;
    one that printed ENOSPC on a workspace with room filled /tmp (a tmpfs sized by memory) or
    asked for more than was left in one go (fallocate). Anything else is returned unchanged.
    """
    if termination is not Termination.NONZERO_EXIT:
        return termination, detail
    raise_it = f"raise it with budget.disk (--disk), now {human_size(size)}; partial files are kept"
    if mount:
        try:
            stat = os.statvfs(mount)
        except OSError:
            stat = None
        if stat is not None and stat.f_blocks:
            free = stat.f_bavail * stat.f_frsize
            total = stat.f_blocks * stat.f_frsize
            if free < max(total // 100, 1024**2) or stat.f_favail == 0:
                what = "no inode left" if stat.f_favail == 0 else f"{human_size(free)} free"
                return Termination.DISK_LIMIT, f"the workspace is full ({what}); {raise_it}"
    text = stderr.decode("utf-8", errors="replace")
    if any(marker in text for marker in _ENOSPC_TEXT):
        return (
            Termination.DISK_LIMIT,
            "no space left on device: a write asked for more than the workspace had left, or "
            f"/tmp (a tmpfs of min(memory, 1G)) is full; {raise_it}, or budget.memory for /tmp",
        )
    return termination, detail


def _owner(home: Path) -> str:
    try:
        return (home / _OWNER).read_text()
    except OSError:
        return ""


def _run(argv: list[str]) -> None:
    if shutil.which(argv[0]) is None:
        raise EngineUnavailable(
            f"{argv[0]} is needed for size-capped workspaces (apt-get install e2fsprogs mount)"
        )
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise WorkstationError(f"preparing the workspace disk: {argv[0]}: {first}")
