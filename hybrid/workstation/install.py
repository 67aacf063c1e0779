"""Bring up the container tiers on this host with the script the package ships (``engine.sh``).

It installs docker.io, runsc (gVisor) and debootstrap when missing, writes a daemon config that
registers runsc, starts dockerd when none runs, and builds the base image from this machine's
apt mirror (no registry). Root only; safe to run again. In a checkout it is scripts/engine.sh.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hybrid.errors import EngineUnavailable

COMMAND = "hybrid engine install"
"""What a message tells a user to run to get the engine (a wheel has no scripts/ directory)."""


def script() -> Path:
    """The packaged engine.sh (a symlink to scripts/engine.sh in a checkout, a copy in a wheel)."""
    path = Path(__file__).resolve().parent / "engine.sh"
    if not path.is_file():
        raise EngineUnavailable(f"{path}: the engine script is missing from this installation")
    return path


def install() -> int:
    """Run the engine script (its progress goes to stderr); its exit status.

    Raises EngineUnavailable when not root: it installs packages and starts a daemon.
    """
    path = script()
    if os.geteuid() != 0:
        raise EngineUnavailable(f"{COMMAND} needs root (it installs packages and starts dockerd)")
    return subprocess.run(["bash", str(path)], check=False).returncode
