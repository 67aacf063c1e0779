"""Who a sandbox job runs as on the host: a uid and gid that no host account has.

Jobs on the docker tiers (runc and runsc), the bwrap tier and inside microVMs run as ``JOB_UID``
and ``JOB_GID``; the workspace they write is owned by them. The kernel's checks between
processes (``ptrace``, ``/proc/PID/environ``, signals) and file permissions compare uids: were a
job's uid a host account's (uid 1000 is the first user of most machines), that account could read
the job's ``env.set`` secrets and ptrace it, and the job could read that account's files. So the
ids sit far above the ranges ``useradd`` hands out (system and login accounts below 60000,
subordinate ranges from 100000 up to ``SUB_UID_MAX`` 600100000) and below 2^31, where no tool
mistakes them for negative numbers; ``holders()`` checks at run time that no account, group or
subordinate range holds them, and the tiers refuse to start a job when one does.

The containers that serve a workstation without running its code (the egress relay and the proxy
that enforces the allow-list, the holder of a namespace its services share) run as ``HELPER_UID``
and ``HELPER_GID``: ids of their own, checked the same way. They used to run as 65534, the host's
``nobody``, so any process running as ``nobody`` could read the proxy's environment and ptrace it.

``HYBRID_JOB_UID`` / ``HYBRID_JOB_GID`` and ``HYBRID_HELPER_UID`` / ``HYBRID_HELPER_GID`` move
them on a host where they are taken.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
from pathlib import Path

from hybrid.errors import EngineUnavailable, WorkstationError

DEFAULT_ID = 1_999_990_000
"""The default uid and gid of every job."""


_MISCONFIGURED: list[str] = []


def _id(variable: str, default: int) -> int:
    raw = os.environ.get(variable)
    if raw is None:
        return default
    value = int(raw) if raw.strip().isdigit() else 0
    if not 0 < value < 2**31 or value == 65534:
        # Not raised here (at import): check() refuses every job, and doctor says why.
        _MISCONFIGURED.append(f"{variable}={raw!r} is not an id in 1..2^31-1 other than 65534")
        return default
    return value


JOB_UID = _id("HYBRID_JOB_UID", DEFAULT_ID)
"""The host uid every sandbox job runs as."""
JOB_GID = _id("HYBRID_JOB_GID", JOB_UID)
"""The host gid every sandbox job runs as."""
USER = f"{JOB_UID}:{JOB_GID}"
"""The same as a container engine's ``--user``."""
HELPER_UID = _id("HYBRID_HELPER_UID", DEFAULT_ID + 1)
"""The host uid of the egress relay and proxy and of namespace holders."""
HELPER_GID = _id("HYBRID_HELPER_GID", HELPER_UID)
"""The host gid of the same containers."""
HELPER_USER = f"{HELPER_UID}:{HELPER_GID}"
"""The same as a container engine's ``--user``."""
if HELPER_UID == JOB_UID or HELPER_GID == JOB_GID:
    # A job could then signal and trace the proxy that confines it, were they ever in one pid
    # namespace (and read what the proxy's ids own).
    _MISCONFIGURED.append(
        f"the helpers' ids {HELPER_USER} share an id with the jobs' {USER}: set HYBRID_HELPER_UID "
        "and HYBRID_HELPER_GID to other ids"
    )


def holders() -> list[str]:
    """Every host account, group or subordinate id range that holds a job's or a helper's uid or
    gid."""
    found = list(_MISCONFIGURED)
    for uid, gid in dict.fromkeys(((JOB_UID, JOB_GID), (HELPER_UID, HELPER_GID))):
        with contextlib.suppress(KeyError):
            found.append(f"host user {pwd.getpwuid(uid).pw_name!r} has uid {uid}")
        with contextlib.suppress(KeyError):
            found.append(f"host group {grp.getgrgid(gid).gr_name!r} has gid {gid}")
        for path, kind, value in (("/etc/subuid", "uid", uid), ("/etc/subgid", "gid", gid)):
            for owner, start, count in _ranges(Path(path)):
                if start <= value < start + count:
                    found.append(
                        f"{path} gives {owner!r} subordinate {kind}s {start}-{start + count - 1}, "
                        f"which hold {value}"
                    )
    return found


def check() -> None:
    """EngineUnavailable when a host account could act as the jobs (see ``holders()``)."""
    found = holders()
    if found:
        raise EngineUnavailable(
            f"sandbox jobs run as uid {JOB_UID} gid {JOB_GID} (their helpers as uid {HELPER_UID} "
            f"gid {HELPER_GID}), but {'; '.join(found)}: that account could read their "
            "environment and trace them. Set HYBRID_JOB_UID and HYBRID_JOB_GID (HYBRID_HELPER_UID "
            "and HYBRID_HELPER_GID) to ids no host account has"
        )


def refuse_host_ids(uid: int, gid: int, what: str) -> None:
    """WorkstationError when ``what`` (made before jobs had ids of their own, or by another
    configuration) runs its commands as a host account's uid or group's gid."""
    found = []
    with contextlib.suppress(KeyError):
        found.append(f"uid {uid}, the host user {pwd.getpwuid(uid).pw_name!r}")
    with contextlib.suppress(KeyError):
        found.append(f"gid {gid}, the host group {grp.getgrgid(gid).gr_name!r}")
    if found:
        raise WorkstationError(
            f"{what} runs its commands as {' and '.join(found)}, who could read and trace "
            f"them: remove it and create it again (jobs now run as uid {JOB_UID} gid {JOB_GID})"
        )


def describe() -> str:
    """One line for ``hybrid doctor``: the ids, and whether a host account holds them."""
    found = holders()
    ids = (
        f"sandbox jobs run as uid {JOB_UID} gid {JOB_GID}, egress proxies and namespace holders "
        f"as uid {HELPER_UID} gid {HELPER_GID}"
    )
    if found:
        return f"{ids}; REFUSED: {'; '.join(found)}"
    return f"{ids}; no host account, group or subordinate range has any of them"


def _ranges(path: Path) -> list[tuple[str, int, int]]:
    # name:start:count per line (shadow-utils' subuid(5)); anything else is skipped.
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    ranges = []
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            ranges.append((parts[0], int(parts[1]), int(parts[2])))
    return ranges


__all__ = [
    "DEFAULT_ID",
    "HELPER_GID",
    "HELPER_UID",
    "HELPER_USER",
    "JOB_GID",
    "JOB_UID",
    "USER",
    "check",
    "describe",
    "holders",
    "refuse_host_ids",
]
