"""The docker tiers' seccomp profile: the engine's own default profile plus the bwrap tier's denials.

Docker 20.10's default profile already refuses ``personality`` with a persona outside PER_LINUX,
PER_LINUX32, UNAME26 and the query, but allows ``socket`` of every family, AF_VSOCK included, and
vsock is not network-namespaced: a job with ``--network none`` could still reach the host or its
hypervisor. So every container made for untrusted code (workstations, one-shot runs, services,
the egress relay and proxy) runs under that default profile, amended here:

- ``socket(AF_VSOCK)`` fails with EPERM (every other family stays allowed, as before);
- ``personality`` stays allowed only for the personas the bwrap filter allows (READ_IMPLIES_EXEC
  and ADDR_NO_RANDOMIZE fail with EPERM), whatever a newer default profile says;
- foreign ABIs (i386 and x32 on x86_64, arm on aarch64) are dropped: their syscall numbers differ,
  and i386 reaches ``socket`` through ``socketcall``, whose arguments sit in memory no filter can
  read. The engine refuses every syscall of an ABI the profile does not name.

The profile is not written here: it is the engine's own, read from the source package of the
engine (``golang-github-docker-docker-dev`` ships moby's ``profiles/seccomp/default.json``; the
project's engine.sh extracts that one file for the installed engine version), so an engine
upgrade brings its own default. No profile found is a clear EngineUnavailable, never a silently
weaker container.

gVisor (runsc) ignores the OCI seccomp profile unless started with ``--oci-seccomp``: its
syscalls meet gVisor's own kernel, which has no AF_VSOCK (EAFNOSUPPORT) and no persona but
PER_LINUX (EINVAL). The profile is passed on that runtime too, so an engine that enables
``--oci-seccomp`` applies it there as well.
"""

from __future__ import annotations

import copy
import errno
import functools
import json
import os
from pathlib import Path
from typing import Any

from hybrid.errors import EngineUnavailable
from hybrid.workstation.bwrap.seccomp import AF_VSOCK, PERSONAS

PACKAGE = "golang-github-docker-docker-dev"
"""The Debian package that ships the engine's default profile (moby's default.json)."""
PACKAGE_PATH = Path("/usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json")
"""Where that package installs it."""
EXTRACTED_NAME = "docker-default-seccomp.json"
"""What engine.sh names the one file it extracts from the package, in its engine directory."""


def sources() -> list[Path]:
    """Where the engine's default profile is looked for: ``$HYBRID_DOCKER_SECCOMP`` alone when set
    (a path the user named never falls back), else the file engine.sh extracted, then the
    package's own path."""
    if os.environ.get("HYBRID_DOCKER_SECCOMP"):
        return [Path(os.environ["HYBRID_DOCKER_SECCOMP"])]
    engine_dir = Path(os.environ.get("HYBRID_ENGINE_DIR") or "/var/lib/hybrid-engine")
    return [engine_dir / EXTRACTED_NAME, PACKAGE_PATH]


@functools.cache
def _loaded() -> tuple[Path, str]:
    tried = sources()
    for path in tried:
        if path.is_file():
            try:
                default = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise EngineUnavailable(
                    f"the engine's default seccomp profile {path} is unreadable ({exc}): "
                    f"reinstall it with scripts/engine.sh (from the Debian package {PACKAGE})"
                ) from None
            return path, json.dumps(amend(default, str(path)), separators=(",", ":"))
    raise EngineUnavailable(
        "the docker tiers run under the engine's default seccomp profile with vsock denied, but "
        f"no default profile was found at {', '.join(str(p) for p in tried)}: run scripts/engine.sh "
        f"(it extracts it from the Debian package {PACKAGE}), install {PACKAGE}, or set "
        "HYBRID_DOCKER_SECCOMP to moby's default.json"
    )


def profile() -> str:
    """The amended profile as JSON text (computed once per process)."""
    return _loaded()[1]


def security_opt() -> list[str]:
    """The ``security_opt`` of every container made for untrusted code."""
    return ["no-new-privileges", f"seccomp={profile()}"]


def describe(runtime: str = "runc", runtime_args: list[str] | None = None) -> str:
    """One line for ``hybrid doctor``: which profile is in force under ``runtime`` (started with
    ``runtime_args``); EngineUnavailable when there is none."""
    path, _ = _loaded()
    line = (
        f"seccomp: the engine's default profile ({path}) with socket(AF_VSOCK), personas beyond "
        "Docker's and foreign ABIs denied"
    )
    if runtime == "runsc" and "--oci-seccomp" not in (runtime_args or []):
        line += (
            " (runsc ignores it without --oci-seccomp; gVisor itself has no AF_VSOCK and no "
            "persona but PER_LINUX)"
        )
    return line


def amend(default: dict[str, Any], where: str = "the default profile") -> dict[str, Any]:
    """``default`` (moby's profile format) with the denials above; EngineUnavailable when it is
    not a deny-by-default profile."""
    if default.get("defaultAction") != "SCMP_ACT_ERRNO" or not isinstance(
        default.get("syscalls"), list
    ):
        raise EngineUnavailable(
            f"{where} is not a deny-by-default seccomp profile (defaultAction "
            f"{default.get('defaultAction')!r}): point HYBRID_DOCKER_SECCOMP at moby's default.json"
        )
    profile = copy.deepcopy(default)
    rules = []
    for rule in profile["syscalls"]:
        names = [n for n in rule.get("names") or [] if n not in ("socket", "socketcall")]
        if rule.get("action") == "SCMP_ACT_ALLOW" and "personality" in names:
            if not _allowed_persona(rule):
                names.remove("personality")
        elif "socket" in (rule.get("names") or []) and rule.get("action") != "SCMP_ACT_ALLOW":
            names.append("socket")  # a denial of the default's own stays
        if names:
            rules.append({**rule, "names": names})
    # socketcall is not allowed again: with the foreign ABIs gone no native ABI has it.
    rules += [
        {
            "names": ["socket"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": errno.EPERM,
            "args": [{"index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_EQ"}],
            "comment": "hybrid: vsock reaches the host or its hypervisor past every netns",
        },
        {
            "names": ["socket"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_NE"}],
            "comment": "hybrid: every other address family, as in the default",
        },
    ]
    profile["syscalls"] = rules
    for arch in profile.get("archMap") or []:
        arch["subArchitectures"] = []
    return profile


def _allowed_persona(rule: dict[str, Any]) -> bool:
    args = rule.get("args") or []
    return (
        len(args) == 1
        and args[0].get("index") == 0
        and args[0].get("op") == "SCMP_CMP_EQ"
        and args[0].get("value") in PERSONAS
    )


__all__ = ["PACKAGE", "amend", "describe", "profile", "security_opt", "sources"]
