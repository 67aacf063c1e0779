"""Driving a real ``hybrid serve`` and the ``hybrid`` console entry as processes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CLIENT = [sys.executable, "-c", "from hybrid.server.client import main; main()"]
"""The `hybrid` console script's entry point, as its own process."""


class Server:
    """One server on a private runtime directory; ``cli`` runs commands through it."""

    def __init__(self, runtime: Path, *options: str) -> None:
        self.runtime = runtime
        self.env = {**os.environ, "HYBRID_RUNTIME_DIR": str(runtime)}
        self.env.pop("HYBRID_NO_SERVER", None)
        self.options = options
        self.info: dict[str, Any] = {}

    def start(self) -> None:
        done = self.hybrid("serve", "--detach", "--json", *self.options, timeout=600)
        assert done.returncode == 0, done.stderr
        self.info = json.loads(done.stdout)

    def status(self) -> dict[str, Any] | None:
        done = self.hybrid("serve", "--status", "--json")
        return json.loads(done.stdout) if done.returncode == 0 else None

    def stop(self) -> None:
        self.hybrid("serve", "--stop")

    def hybrid(
        self,
        *args: str,
        stdin: bytes = b"",
        cwd: Path | None = None,
        timeout: float = 300,
        **env: str,
    ) -> subprocess.CompletedProcess[str]:
        """``hybrid ARGS`` through the console entry (the server when one answers)."""
        return subprocess.run(
            [*CLIENT, *args],
            input=stdin.decode(),
            capture_output=True,
            text=True,
            cwd=cwd,
            env={**self.env, **env},
            timeout=timeout,
        )

    def local(
        self, *args: str, stdin: bytes = b"", cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``hybrid ARGS`` in its own process, never through a server."""
        return self.hybrid(*args, stdin=stdin, cwd=cwd, HYBRID_NO_SERVER="1")

    def pids(self) -> list[int]:
        """The daemon and its workers (children of any of its threads)."""
        daemon = int(self.info["pid"])
        found = [daemon]
        for task in Path(f"/proc/{daemon}/task").glob("*"):
            with contextlib.suppress(OSError):
                found += [int(p) for p in (task / "children").read_text().split()]
        return found


def gone(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] == "Z"


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# Timings (and the fuel of a guest that polls a clock) differ between any two runs, in
# process or not.
_TIMES = re.compile(
    r"\d+(?:\.\d+)? ?ms|fuel [\d,]+|\"(?:wall_ms|cpu_ms|elapsed_ms|build_ms|fuel_used)\": [0-9.e-]+"
)


def normal(text: str) -> str:
    return _TIMES.sub("<t>", text)
