"""Workstations in bubblewrap namespace sandboxes (tier ``bwrap``): no daemon, no snapshots.

``rootfs`` (the read-only toolchain root), ``cgroups`` (limits, v1 or v2), ``seccomp`` (the
filter), ``sandbox`` (one supervised bwrap run), ``workspace`` (the capped tmpfs and safe file
access), ``workstation`` (the backend).
"""

from hybrid.workstation.bwrap.workstation import BwrapBackend, BwrapWorkstation

__all__ = ["BwrapBackend", "BwrapWorkstation"]
