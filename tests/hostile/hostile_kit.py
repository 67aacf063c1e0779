"""The hostile suite's machinery: the tier list, one driver per tier, the leftover check, the table.

``hostile_tiers()`` is the one place the tier list is built. A ``Driver`` runs an ``Attack`` (one
hostile job written for each kind of tier) on its tier. ``leftovers()`` lists what a case left
behind since its ``baseline()``: engine objects this process or its CLI children made (containers,
volumes, networks, their cgroups and processes), scratch directories, /dev/shm entries, cgroups,
child processes, busy threads and file descriptors. ``table()`` is the closing case x tier table.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

from hybrid import tiers
from hybrid.policy import Budget, SandboxSpec
from hybrid.results import ExecutionResult
from hybrid.tiers.container import container_tiers

ROOT = Path(__file__).resolve().parents[2]
CONTAINER_TIERS = tuple(t.name for t in container_tiers())
"""The registered tiers that run on the Docker engine (docker, gvisor)."""
ENGINE_TIERS = (*CONTAINER_TIERS, "workstation")
WASM_SLACK = 3.0
"""Seconds past a deadline an in-process tier may take to report (a loaded 2-core machine)."""
ENGINE_SLACK = 15.0
"""Seconds past a deadline a container tier may take (engine calls queue behind other jobs)."""
GRACE = 5.0
"""How long the leftover check waits for asynchronous cleanup before it reports."""

# Budgets every case starts from: small, so the suite stays within minutes on two cores.
BASE_BUDGET: dict[str, Any] = {
    "wall_seconds": 3.0,
    "memory": "128M",
    "pids": 64,
    "output_bytes": "64k",
    "fuel": 10**13,
}


def hostile_tiers() -> list[str]:
    """Every tier the suite attacks: the registered tiers plus a long-lived workstation. A tier
    added to the registry (``hybrid.tiers``) is attacked without editing this suite (as a
    process tier, through ``hybrid.router.run`` and ``hybrid run --tier``)."""
    return [*dict.fromkeys([*tiers.names(), "workstation"])]


# -- attacks and drivers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Attack:
    """One hostile job, written for each kind of tier.

    ``wasi``: probe arguments (or, with ``module``, a module of its own: WAT text);
    ``python``: a snippet for python-wasm; ``shell``: a /bin/sh script for every process tier
    (docker, gvisor, a workstation and any tier a registry adds later).
    """

    wasi: Sequence[str] = ()
    python: str = ""
    shell: str = ""
    module: str | None = None


@dataclass
class Row:
    """One case x tier line of the closing table."""

    case: str
    tier: str
    termination: str = ""
    wall_s: float = 0.0
    leftovers: list[str] = field(default_factory=list)
    outcome: str = ""

    def note(self, result: ExecutionResult | str) -> None:
        """Record how the (last) run of the case ended."""
        self.termination = result if isinstance(result, str) else result.termination.value


_ROWS: dict[str, Row] = {}
CHILDREN: set[int] = set()
"""Pids of CLI processes the suite started: engine objects they label as owner are the case's."""


class Driver:
    """Runs attacks on one tier; ``kind`` says which part of an Attack it uses."""

    kind = "process"
    tier = ""

    def __init__(self, tier: str, row: Row) -> None:
        self.tier = tier
        self.row = row

    def budget(self, **overrides: Any) -> Budget:
        values = {**BASE_BUDGET, **overrides}
        if self.kind == "process":
            values.pop("fuel", None)
        return Budget.model_validate(values)

    def spec(self, **budget: Any) -> SandboxSpec:
        return SandboxSpec(tier=self.spec_tier, budget=self.budget(**budget))  # type: ignore[arg-type]

    @property
    def spec_tier(self) -> str:
        return self.tier

    @property
    def slack(self) -> float:
        return WASM_SLACK if self.kind in ("wasi", "python") else ENGINE_SLACK

    def run(self, attack: Attack, **budget: Any) -> ExecutionResult:
        raise NotImplementedError

    def cli(self, attack: Attack, **budget: Any) -> list[str]:
        """The same attack as `hybrid ...` arguments (a CLI client a test can kill)."""
        raise NotImplementedError

    def _done(self, result: ExecutionResult) -> ExecutionResult:
        self.row.note(result)
        return result


def _budget_flags(budget: Budget, names: Sequence[str]) -> list[str]:
    flags = {
        "timeout": str(budget.wall_seconds),
        "memory": str(budget.memory),
        "fuel": str(budget.fuel),
        "pids": str(budget.pids),
        "output-bytes": str(budget.output_bytes),
    }
    return [item for name in names for item in (f"--{name}", flags[name])]


class WasiDriver(Driver):
    """The wasm tier: the probe module (tests/wasm/probe.rs) or a module of the attack's own."""

    kind = "wasi"

    def __init__(self, tier: str, row: Row, probe: Path, workdir: Path) -> None:
        super().__init__(tier, row)
        self.probe = probe
        self.workdir = workdir

    def module_path(self, attack: Attack) -> Path:
        if attack.module is None:
            return self.probe
        path = self.workdir / f"attack-{secrets.token_hex(4)}.wat"
        path.write_text(attack.module)
        return path

    def run(
        self, attack: Attack, *, spec: SandboxSpec | None = None, **budget: Any
    ) -> ExecutionResult:
        from hybrid.wasm import run

        module = self.module_path(attack)
        return self._done(run(module, list(attack.wasi), spec=spec or self.spec(**budget)))

    def cli(self, attack: Attack, **budget: Any) -> list[str]:
        flags = _budget_flags(self.budget(**budget), ("timeout", "memory", "fuel"))
        return ["wasm", "run", str(self.module_path(attack)), *flags, "--", *attack.wasi]


class PythonDriver(Driver):
    """The python-wasm tier: snippets through hybrid.run_python."""

    kind = "python"

    def run(
        self,
        attack: Attack,
        *,
        spec: SandboxSpec | None = None,
        files: Any = None,
        **budget: Any,
    ) -> ExecutionResult:
        from hybrid.wasm.python import run_python

        return self._done(run_python(attack.python, spec=spec or self.spec(**budget), files=files))

    def cli(self, attack: Attack, **budget: Any) -> list[str]:
        flags = _budget_flags(self.budget(**budget), ("timeout", "memory", "fuel"))
        return ["py", "eval", attack.python, *flags]


class ProcessDriver(Driver):
    """A one-shot process tier (docker, gvisor, and whatever the registry adds): hybrid.router.run."""

    def run(
        self,
        attack: Attack,
        *,
        spec: SandboxSpec | None = None,
        repo: Path | None = None,
        **budget: Any,
    ) -> ExecutionResult:
        from hybrid import router

        job = router.Job(
            command=["/bin/sh", "-c", attack.shell],
            needs_processes=True,
            repo=repo,
            spec=spec or self.spec(**budget),
        )
        return self._done(router.run(job, self.tier))  # type: ignore[arg-type]

    def cli(self, attack: Attack, **budget: Any) -> list[str]:
        flags = _budget_flags(self.budget(**budget), ("timeout", "memory", "pids"))
        return [
            "run",
            "--tier",
            self.tier,
            "--processes",
            *flags,
            "--",
            "/bin/sh",
            "-c",
            attack.shell,
        ]


WORKSTATION_ALLOW = ["example.com"]
"""The shared workstation's egress allow-list: it sits behind the proxy, like `ws up --allow`."""


class WorkstationDriver(Driver):
    """A long-lived runc workstation with a repository copy and the egress proxy (one per
    session); cases that damage their sandbox ask for ``fresh()`` ones."""

    def __init__(
        self, tier: str, row: Row, backend: Any, shared: Callable[[], Any], repo: Path
    ) -> None:
        super().__init__(tier, row)
        self.backend = backend
        self._shared = shared
        self.repo = repo

    @property
    def spec_tier(self) -> str:
        return "docker"

    @property
    def ws(self) -> Any:
        return self._shared()

    def run(
        self, attack: Attack, *, ws: Any = None, spec: SandboxSpec | None = None, **budget: Any
    ) -> ExecutionResult:
        timeout = float(budget.get("wall_seconds", BASE_BUDGET["wall_seconds"]))
        if spec is not None:  # a spec of the case's own: a workstation of its own
            with self.backend.create(spec, repo=self.repo) as made:
                return self._done(made.exec(["/bin/sh", "-c", attack.shell], timeout=timeout))
        target = ws or self.ws
        return self._done(target.exec(["/bin/sh", "-c", attack.shell], timeout=timeout))

    @contextlib.contextmanager
    def fresh(self, *, repo: Path | None = None, **budget: Any) -> Iterator[Any]:
        """A workstation of this case's own (removed when the block ends), like `ws up --repo`."""
        with self.backend.create(self.spec(**budget), repo=repo or self.repo) as made:
            yield made

    def cli(self, attack: Attack, *, name: str | None = None, **budget: Any) -> list[str]:
        timeout = str(budget.get("wall_seconds", BASE_BUDGET["wall_seconds"]))
        return [
            "ws",
            "exec",
            name or self.ws.name,
            "--timeout",
            timeout,
            "--",
            "/bin/sh",
            "-c",
            attack.shell,
        ]


def make_repo(root: Path) -> Path:
    """A small git repository, as a user would hand to `ws up --repo`."""
    repo = root / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("# hostile\n")
    (repo / "app.py").write_text("print('hello')\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    return repo


def git(repo: Path, *args: str) -> None:
    """Run git in ``repo`` with a fixed identity (tests must not depend on the host's config)."""
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


# -- the CLI as a separate process -----------------------------------------------------------------


def hybrid_cli(args: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start `hybrid ARGS` (this worktree's code) as a child process the leftover check knows."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    child = subprocess.Popen([sys.executable, "-m", "hybrid", *args], env=env, **popen)
    CHILDREN.add(child.pid)
    return child


def stop_children() -> None:
    """Kill every CLI child still running (after the leftover check has seen it)."""
    for pid in list(CHILDREN):
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)


# -- what a case may leave behind -------------------------------------------------------------------


def _resource_tracker(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return b"multiprocessing.resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return False


def _descendants(pid: int, skip: Collection[int] = ()) -> list[tuple[int, str]]:
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        if fields[0] == "Z":
            continue
        child = int(stat.split("/")[2])
        parents[child], names[child] = int(fields[1]), name
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        for child, parent in parents.items():
            if parent == current and child not in skip:
                found.append((child, names[child]))
                frontier.append(child)
    return found


def _fds() -> dict[str, str]:
    links = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            # Sockets: the engine client's connection pool; memfds: wasmtime's per-module memory
            # images, which live as long as the compiled module stays cached.
            if not target.startswith(("socket:", "anon_inode:", "/memfd:")):
                links[fd] = target
    return links


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.is_dir() else set()


def _shm() -> set[str]:
    """hybrid entries in /dev/shm, where a wasm CLI child keeps its run I/O. Every process on
    this machine makes them, so they are only looked at for wasm cases that started a child."""
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("hybrid*")} if shm.is_dir() else set()


_IDLE_FRAMES = {"_serve", "_loop", "wait", "get", "select", "_watch_epochs", "run"}


def _busy_threads(before: set[int]) -> list[str]:
    frames = sys._current_frames()
    busy = []
    for thread in threading.enumerate():
        if thread.ident in before or not thread.is_alive() or thread.ident not in frames:
            continue
        if frames[thread.ident].f_code.co_name in _IDLE_FRAMES:
            continue  # a pooled worker waiting for its next job
        busy.append(f"thread {thread.name} in {frames[thread.ident].f_code.co_name}")
    return busy


@dataclass
class Baseline:
    started: float
    tmp: set[str]
    io: set[str]
    shm: set[str]
    children: int
    fds: dict[str, str]
    threads: set[int]
    processes: set[int]


def baseline(tmp: Path, io: Path) -> Baseline:
    return Baseline(
        started=time.time(),
        tmp=_tree(tmp),
        io=_tree(io),
        shm=_shm(),
        children=len(CHILDREN),
        fds=_fds(),
        threads={t.ident for t in threading.enumerate() if t.ident is not None},
        processes={pid for pid, _ in _descendants(os.getpid())},
    )


def _engine_leftovers(started: float) -> list[str]:
    """Containers, volumes, networks, cgroups and processes of containers that this process or
    its CLI children created during the case (other helpers' objects are never looked at)."""
    from hybrid.workstation.docker import client

    api = client().api
    mine = {str(os.getpid()), *map(str, CHILDREN)}
    host = socket.gethostname()
    events = api.events(
        since=f"{started:.6f}",
        until=f"{time.time():.6f}",
        filters={"type": "container", "event": "create", "label": "hybrid.managed=1"},
        decode=True,
    )
    found = []
    for event in events:
        attrs = event.get("Actor", {}).get("Attributes", {})
        owner = attrs.get("hybrid.owner", "").split(":")
        if len(owner) != 3 or owner[0] != host or owner[1] not in mine:
            continue
        cid, name = event["Actor"]["ID"], attrs.get("name", "")
        if api.containers(all=True, filters={"id": cid}):
            found.append(f"container {name}")
        volume = attrs.get("hybrid.volume")
        if volume and any(
            v["Name"] == volume for v in api.volumes(filters={"name": volume}).get("Volumes") or []
        ):
            found.append(f"volume {volume}")
        network = attrs.get("hybrid.network")
        if network and any(n["Name"] == network for n in api.networks(names=[network])):
            found.append(f"network {network}")
        cgroups = glob.glob(f"/sys/fs/cgroup/*/docker/{cid}*")
        if cgroups:
            found.append(f"{len(cgroups)} cgroups of {name}")
        processes = []
        for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                if (
                    cid.encode() in Path(cmdline).read_bytes()
                    and int(cmdline.split("/")[2]) != os.getpid()
                ):
                    processes.append(cmdline.split("/")[2])
        if processes:
            found.append(f"processes {','.join(processes)} of {name}")
    return found


def leftovers(base: Baseline, tmp: Path, io: Path, tier: str) -> list[str]:
    """Everything new since ``base`` that should not outlive a case."""
    from hybrid.wasm.runtime import remove_scratch_dirs

    remove_scratch_dirs()  # idle per-thread scratch directories go at exit; so here
    # python-wasm keeps idle worker processes for reuse, by design: exactly those (with their
    # scratch directories, named for their pids) may stay.
    from hybrid.wasm.python.isolation import idle_workers

    workers = idle_workers()
    pooled_dirs = tuple(f"hybrid-py-{pid}-" for pid in workers)
    found = [
        f"tmp {name}"
        for name in sorted(_tree(tmp) - base.tmp)
        if not (pooled_dirs and name.startswith(pooled_dirs))
    ]
    found += [f"io {name}" for name in sorted(_tree(io) - base.io)]
    if tier == "wasm" and len(CHILDREN) > base.children:
        found += [f"/dev/shm/{name}" for name in sorted(_shm() - base.shm)]
    pooled = {str(fd) for pair in workers.values() for fd in pair}
    # multiprocessing's resource tracker: one helper process per interpreter, started on first
    # use (a PythonPool) and kept until exit by design, like the workers above.
    tracker = getattr(resource_tracker._resource_tracker, "_fd", None)
    if tracker is not None:
        pooled.add(str(tracker))
    # The exec backstop: one helper process per client process, likewise kept until exit.
    from hybrid.workstation.docker import backstop

    helper = backstop.helper()
    kept = set(workers)
    if helper is not None:
        kept.add(helper[0])
        pooled.add(str(helper[1]))
    fds = _fds()
    found += [
        f"fd {fd} -> {target}"
        for fd, target in sorted(fds.items())
        if base.fds.get(fd) != target and fd not in base.fds and fd not in pooled
    ]
    found += _busy_threads(base.threads)
    found += [
        f"child process {pid} {name}"
        for pid, name in _descendants(os.getpid(), skip=kept)
        if pid not in base.processes and not _resource_tracker(pid)
    ]
    found += [
        f"cgroup {p}"
        for p in glob.glob("/sys/fs/cgroup/*/hybrid*")
        if os.stat(p).st_ctime >= base.started
    ]
    if tier in ENGINE_TIERS:
        found += _engine_leftovers(base.started)
    return found


def table() -> str:
    """The case x tier table as Markdown."""
    lines = [
        "| case | tier | termination | wall s | leftovers | outcome |",
        "|---|---|---|---:|---|---|",
    ]
    for found in sorted(_ROWS.values(), key=lambda r: (r.case, r.tier)):
        left = "; ".join(found.leftovers) if found.leftovers else "none"
        lines.append(
            f"| {found.case} | {found.tier} | {found.termination or '-'} | {found.wall_s:.1f} | {left} | {found.outcome} |"
        )
    return "\n".join(lines) + "\n"


def host_addresses() -> list[str]:
    """Every address of this host: each interface's IPv4 (from the kernel's local routes) and
    global IPv6 addresses, loopback included (the in-process tiers share the host's loopback)."""
    found: list[str] = []
    with contextlib.suppress(OSError):
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
        for previous, line in itertools.pairwise(lines):
            if "/32 host LOCAL" in line:
                address = previous.split()[-1]
                if address not in found:
                    found.append(address)
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw, _index, _prefix, scope = line.split()[:4]
            if scope in ("00", "10"):  # global or host (::1); link-local needs a zone
                address = ":".join(raw[i : i + 4] for i in range(0, 32, 4))
                found.append(
                    socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, address))
                )
    return found


class Listener:
    """A TCP listener on every host address: counts every connection that reaches it."""

    BANNER = b"HTTP/1.0 200 OK\r\nContent-Length: 20\r\n\r\nHYBRID-HOST-LISTENER"

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.sock.bind(("::", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.peers: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hostile-listener", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.peers.append(str(peer[0]))
            with contextlib.suppress(OSError), conn:
                conn.sendall(self.BANNER)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


WARMED: set[str] = set()


def warm(driver: Driver) -> None:
    """Run one harmless job per in-process tier before its first case, so one-time set-up (the
    compiled module cache, the output drainer, the python-wasm worker and guest) is not counted as
    something a case left behind."""
    if driver.tier in WARMED:
        return
    if driver.kind == "wasi":
        driver.run(Attack(wasi=["print", "warm"]))
    elif driver.kind == "python":
        driver.run(Attack(python="print('warm')"))
    driver.row.termination = ""
    WARMED.add(driver.tier)


def damaging(driver: Driver, attack: Attack, **budget: Any) -> ExecutionResult:
    """Run an attack that may wreck its sandbox: a workstation gets a fresh one for it."""
    if isinstance(driver, WorkstationDriver):
        with driver.fresh(**budget) as ws:
            return driver.run(attack, ws=ws, **budget)
    return driver.run(attack, **budget)


def host_secret_line() -> str:
    """The host's /etc/shadow first line (this suite runs as root), or a marker nothing prints."""
    try:
        return Path("/etc/shadow").read_text().splitlines()[0]
    except (OSError, IndexError):
        return f"no-shadow-{secrets.token_hex(8)}"


def containers_of(pid: int) -> dict[str, str]:
    """name -> state of every hybrid container whose owner label names process ``pid`` here."""
    from hybrid.workstation.docker import client

    host = socket.gethostname()
    found = {}
    for row in client().api.containers(all=True, filters={"label": "hybrid.managed=1"}):
        owner = (row.get("Labels") or {}).get("hybrid.owner", "").split(":")
        if len(owner) == 3 and owner[0] == host and owner[1] == str(pid):
            found[(row.get("Names") or [row["Id"]])[0].lstrip("/")] = row.get("State", "")
    return found


def jobs_of(pid: int) -> dict[str, str]:
    """name -> "alive" for each running hybrid container process ``pid`` owns whose spinning job
    (the shell that wrote its pid to .spin-pid) still runs, looked up inside the sandbox.

    A one-shot container's PID 1 is a bare ``sleep`` the engine ends by itself a setup allowance
    after the deadline; what must not outlive the deadline is the job, which the watchdog inside
    the exec kills without any client. (``docker top`` cannot tell: under gVisor it lists host
    threads, not the sandbox's processes.)"""
    from hybrid.workstation import jobuser
    from hybrid.workstation.docker import client

    api = client().api
    # A killed job may stay a zombie (PID 1 is a bare sleep that reaps nothing): that is gone.
    probe = (
        'p=$(cat .spin-pid 2>/dev/null) && test -d "/proc/$p" '
        "&& ! grep -q '^State:[[:space:]]*Z' \"/proc/$p/status\" && echo alive || echo gone"
    )
    found: dict[str, str] = {}
    for name, state in containers_of(pid).items():
        if state != "running":
            continue
        with contextlib.suppress(Exception):  # it may end between the listing and here
            exec_id = api.exec_create(name, ["sh", "-c", probe], user=jobuser.USER)["Id"]
            if api.exec_start(exec_id).decode().strip() == "alive":
                found[name] = "alive"
    return found
