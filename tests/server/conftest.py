"""A real ``hybrid serve`` per test module (helpers in server_kit.py)."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# The test modules import the kit by name: --import-mode=importlib puts no test directory on sys.path.
sys.path.insert(0, str(Path(__file__).parent))

from server_kit import Server, gone, wait_for


@pytest.fixture(scope="module")
def runtime_dir() -> Iterator[Path]:
    # Under /tmp rather than $TMPDIR: the other-user test needs every directory above the socket
    # searchable by nobody (CI's TMPDIR is not), and a socket path must stay under 108 bytes.
    with tempfile.TemporaryDirectory(prefix="hsrv-", dir="/tmp") as made:
        yield Path(made)


@pytest.fixture(scope="module")
def server(runtime_dir: Path) -> Iterator[Server]:
    made = Server(runtime_dir, "--pool-size", "0", "--idle", "900")
    made.start()
    yield made
    pids = made.pids()
    made.stop()
    try:
        wait_for(lambda: all(gone(p) for p in pids), 60, "the server and its workers to exit")
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
