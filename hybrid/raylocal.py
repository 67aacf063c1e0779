"""A Ray cluster of several node processes on this machine: for trying fan-out and for its tests.

Node ``i`` is a real ``ray start`` node process (its own raylet, object store and workers).
Every node's address is 127.0.0.1, the one address for which Ray binds its GCS, raylets and
workers to loopback instead of every interface (another address, even 127.0.0.2, and Ray
listens on 0.0.0.0: anyone who reaches the machine could read and write the cluster's tables
and run code in it, the class of CVE-2023-48022). Ray's command line turns 127.0.0.1 into the
machine's outward address; the launcher below keeps it. Ray's own token authentication is on
where the installed Ray has it (2.52 and later): the token lives in a 0600 file in the state
directory (one per user, so a process that met one cluster can join the next: Ray's loader
keeps the first token a process sees).

``close()`` ends exactly the processes of this cluster (by the temp directory their command
lines name, and their children), never another Ray on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hybrid import paths, tokens
from hybrid.errors import EngineUnavailable
from hybrid.fanout import LOOPBACK_LAUNCH, NODE_CPUS

START_TIMEOUT = 180.0
"""Seconds one ``ray start`` may take on a loaded machine."""

_CLOSE_WAIT = 10.0
"""Seconds ``close`` keeps killing until no process of the cluster is left."""

NODE_IP = "127.0.0.1"
"""Every node's address: the only one Ray binds to loopback alone (see the module docstring)."""

TOKEN_AUTH_SINCE = (2, 52)
"""The first Ray release with token authentication (RAY_AUTH_MODE=token)."""


def token_auth_available() -> bool:
    """Whether the installed Ray can authenticate its clients with a token."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("ray")
    except PackageNotFoundError:
        return False
    numbers = tuple(int(p) for p in release.split(".")[:2] if p.isdigit())
    return numbers >= TOKEN_AUTH_SINCE


def token_path() -> Path:
    """The user's token for local Ray clusters (0600 in the 0700 state directory)."""
    return paths.state_dir("ray") / "auth_token"


def _free_port() -> int:
    # The kernel's ephemeral range lies above Ray's worker port range (10002-19999).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline)
    return found


class LocalCluster:
    """``nodes`` Ray node processes of ``cpus`` CPUs each; a context manager."""

    def __init__(self, nodes: int = 2, cpus: int = 1, env: dict[str, str] | None = None) -> None:
        self.nodes = nodes
        self.cpus = cpus
        # The authentication mode said outright: left to itself, Ray picks it per process from
        # whether ~/.ray/auth_token exists, and a node that decides otherwise than the head
        # cannot join it. Token mode reads the user's own token file (never ~/.ray's).
        self.authenticated = token_auth_available()
        """Whether the cluster asks every client for its token (Ray 2.52 and later)."""
        self.auth = {"RAY_AUTH_MODE": "disabled"}
        if self.authenticated:
            path = token_path()
            tokens.kept(path)
            self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}
        """What a client of this cluster needs in its environment (``with`` sets it here)."""
        self.env = {**os.environ, **(env or {}), "RAY_USAGE_STATS_ENABLED": "0", **self.auth}
        self.env.pop("RAY_AUTH_TOKEN", None)  # it would win over the token file
        self._saved: dict[str, str | None] = {}
        self.temp_dir = Path(tempfile.mkdtemp(prefix="hybrid-ray-", dir="/tmp"))
        self.port = _free_port()
        self.address = f"{NODE_IP}:{self.port}"

    def node_cpus(self, node: int) -> str:
        """The host CPUs node ``node`` stands for: ``cpus`` of them, dealt round robin."""
        allowed = sorted(os.sched_getaffinity(0))
        return ",".join(
            str(allowed[(node * self.cpus + k) % len(allowed)]) for k in range(self.cpus)
        )

    @staticmethod
    def name(node: int) -> str:
        """Node ``node``'s name (its raylet's command line says it)."""
        return f"hybrid-node{node}"

    def start(self) -> LocalCluster:
        ray = [sys.executable, "-c", LOOPBACK_LAUNCH, "start", "--disable-usage-stats"]
        try:
            for node in range(self.nodes):
                common = [
                    f"--node-ip-address={NODE_IP}",
                    f"--node-name={self.name(node)}",
                    f"--num-cpus={self.cpus}",
                    f"--resources={json.dumps({f'node{node}': 1})}",
                ]
                if node == 0:
                    argv = [
                        *ray,
                        "--head",
                        f"--port={self.port}",
                        "--include-dashboard=false",
                        f"--temp-dir={self.temp_dir}",
                        *common,
                    ]
                else:
                    argv = [*ray, f"--address={self.address}", *common]
                done = subprocess.run(
                    argv,
                    env={**self.env, NODE_CPUS: self.node_cpus(node)},
                    capture_output=True,
                    text=True,
                    timeout=START_TIMEOUT,
                )
                if done.returncode != 0:
                    raise EngineUnavailable(
                        f"ray start (node {node}) failed: {done.stderr.strip()[-500:]}"
                    )
        except BaseException:
            self.close()
            raise
        return self

    def _tree(self, roots: set[int]) -> list[int]:
        """``roots`` and all their descendants, children first."""
        table = _processes()
        children: dict[int, list[int]] = {}
        for pid, (parent, _) in table.items():
            children.setdefault(parent, []).append(pid)
        order: list[int] = []
        stack = list(roots)
        while stack:
            pid = stack.pop()
            if pid in order:
                continue
            order.append(pid)
            stack.extend(children.get(pid, []))
        return order[::-1]

    def _mine(self, marker: str = "") -> set[int]:
        table = _processes()
        return {
            pid
            for pid, (_, cmd) in table.items()
            if str(self.temp_dir) in cmd and marker in cmd and pid != os.getpid()
        }

    def _raylets(self, node: int) -> set[int]:
        table = _processes()
        return {
            pid
            for pid in self._mine(f"--node-name={self.name(node)} ")
            if table.get(pid, (0, ""))[1].split(" ", 1)[0].endswith("/raylet")
        }

    def running(self, node: int) -> list[str]:
        """The tasks node ``node``'s workers are running now (their process titles, ``ray::f``)."""
        table = _processes()
        idle = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
        return [
            table[pid][1].strip()
            for pid in self._tree(self._raylets(node))
            if pid in table
            and table[pid][1].startswith("ray::")
            and not table[pid][1].startswith(idle)
        ]

    def kill_node(self, node: int) -> None:
        """SIGKILL node ``node`` (its raylet and every worker under it), as a crashed machine."""
        raylets = self._raylets(node)
        if not raylets:
            raise EngineUnavailable(f"node {node} of the local cluster is not running")
        for pid in self._tree(raylets):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        """End every process of this cluster and remove its temp directory (idempotent)."""
        # Until none is left: a killed process shows its command line until its teardown ends,
        # and one started between the listing and the kills (a worker a raylet was spawning)
        # would outlive a single pass.
        end = time.monotonic() + _CLOSE_WAIT
        while (left := self._tree(self._mine())) and time.monotonic() < end:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        """Start the cluster and let this process (and what it starts) connect as a client."""
        self._saved = {key: os.environ.get(key) for key in (*self.auth, "RAY_AUTH_TOKEN")}
        os.environ.pop("RAY_AUTH_TOKEN", None)
        os.environ.update(self.auth)
        _reload_auth()
        try:
            return self.start()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
        self._restore()

    def _restore(self) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _reload_auth()


def _reload_auth() -> None:
    """Have Ray, if this process imported it already, read the authentication settings again
    (it reads RAY_AUTH_MODE and the token once and keeps them; ray.init does not look again)."""
    if "ray" not in sys.modules:
        return
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
