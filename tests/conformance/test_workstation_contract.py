"""The workstation contract, run against every backend this host can run: local (host
processes, not a sandbox), bwrap, docker with runc, docker with runsc and QEMU microVMs. Everything goes through the
protocols in hybrid.workstation.base only (Backend, Workstation, and Snapshots where the
backend has it), so a new backend is conformant when it passes this module unchanged.

The Docker backends need the real engine and bwrap needs bubblewrap, root and cgroups (each a
failure under HYBRID_REQUIRE_ENGINE=1 when absent).
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybrid.errors import InvalidInput, PolicyViolation, WorkstationError, WorkstationNotFound
from hybrid.policy import Budget, SandboxSpec
from hybrid.results import Termination
from hybrid.tiers.container import container_tiers
from hybrid.workstation import (
    Backend,
    Snapshots,
    SnapshotWorkstation,
    Workstation,
    snapshots_of,
    snapshotting,
)
from hybrid.workstation import (
    backend as make_backend,
)

pytestmark = pytest.mark.timeout(300)

BACKENDS = ["local", "bwrap", *(t.runtime for t in container_tiers()), "microvm"]
"""local, bwrap, one Docker backend per container tier's runtime (runc, runsc), QEMU microVMs."""


class Host:
    """A backend under test and the spec its workstations get."""

    def __init__(self, backend: Backend, tier: str) -> None:
        self.backend = backend
        self.tier = tier

    def spec(self, **budget: object) -> SandboxSpec:
        values: dict[str, object] = {"wall_seconds": 30, "memory": "256M", "pids": 64}
        values.update(budget)
        return SandboxSpec(
            tier=self.tier,
            budget=Budget.model_validate(values),
            env={"allow": ["GREETING"]},  # type: ignore[arg-type]
        )


@pytest.fixture(params=BACKENDS)
def host(request: pytest.FixtureRequest) -> Host:
    if request.param == "local":
        return Host(make_backend("local"), "auto")
    if request.param == "bwrap":
        return Host(request.getfixturevalue("bwrap_backend"), "bwrap")
    if request.param == "microvm":
        return Host(request.getfixturevalue("microvm"), "microvm")
    tier = next(t.name for t in container_tiers() if t.runtime == request.param)
    engine = request.getfixturevalue("engine")
    request.getfixturevalue("require_runtime")(tier)
    return Host(engine, tier)


@pytest.fixture
def ws(host: Host) -> Iterator[Workstation]:
    with host.backend.create(host.spec(), name=f"conf-{secrets.token_hex(4)}") as made:
        yield made


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "app.py").write_text("print('old')\n")
    (root / "README").write_text("kept\n")
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"],
    ):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    return root


def test_backend_and_workstation_satisfy_the_protocols(host: Host, ws: Workstation):
    assert isinstance(host.backend, Backend)
    assert isinstance(ws, Workstation)
    assert ws.spec.budget.wall_seconds == 30
    assert host.backend.open(ws.name).id == ws.id
    assert ws.name in [info.name for info in host.backend.list()]


def test_exec_reports_how_a_command_ended(ws: Workstation):
    ok = ws.exec(["sh", "-c", "echo out; echo err >&2"])
    assert (ok.termination, ok.exit_code, ok.stdout, ok.stderr) == (
        Termination.OK,
        0,
        "out\n",
        "err\n",
    )
    failed = ws.exec("exit 3")
    assert (failed.termination, failed.exit_code) == (Termination.NONZERO_EXIT, 3)
    seen: list[tuple[str, bytes]] = []
    streamed = ws.exec("echo live", on_output=lambda kind, chunk: seen.append((kind, chunk)))
    assert streamed.ok and b"".join(c for k, c in seen if k == "stdout") == b"live\n"
    assert ws.exec("echo $GREETING", env={"GREETING": "hi"}).stdout == "hi\n"
    with pytest.raises(PolicyViolation, match="OTHER is not on the allow-list"):
        ws.exec("true", env={"OTHER": "x"})
    ws.exec("mkdir -p sub")
    assert ws.exec("pwd", workdir="sub").stdout.strip().endswith("/sub")


def test_exec_deadline_and_output_budget(host: Host):
    with host.backend.create(host.spec(output_bytes="1k")) as ws:
        started = time.monotonic()
        slow = ws.exec("sleep 30", timeout=1)
        assert slow.termination is Termination.TIMEOUT and slow.exit_code is None
        assert time.monotonic() - started < 20
        loud = ws.exec("head -c 100000 /dev/zero | tr '\\0' x")
        assert loud.termination is Termination.OUTPUT_LIMIT and loud.stdout_truncated
        assert len(loud.stdout) == 1024


def test_put_and_get(ws: Workstation, tmp_path: Path):
    ws.put(b"bytes in\n", "dir/a.txt")
    assert ws.get("dir/a.txt") == b"bytes in\n"
    assert ws.exec("cat dir/a.txt").stdout == "bytes in\n"
    tree = tmp_path / "tree"
    (tree / "deep").mkdir(parents=True)
    (tree / "deep" / "b.txt").write_text("from the host\n")
    ws.put(tree, "copied")
    assert ws.exec("cat copied/deep/b.txt").stdout == "from the host\n"
    out = tmp_path / "out"
    assert ws.get(f"{ws.spec.workspace}/dir/a.txt", out) is None
    assert (out / "a.txt").read_bytes() == b"bytes in\n"
    assert ws.get("copied", out) is None
    assert (out / "copied" / "deep" / "b.txt").read_text() == "from the host\n"
    with pytest.raises(InvalidInput, match="not a regular file"):
        ws.get("copied")


def test_diff_shows_every_change_since_the_repository_went_in(host: Host, repo: Path):
    with host.backend.create(host.spec(), repo=repo) as ws:
        assert ws.diff() == ""
        assert ws.exec("echo \"print('new')\" > app.py && echo added > new.txt").ok
        patch = ws.diff()
    assert "-print('old')" in patch and "+print('new')" in patch
    assert "new.txt" in patch and "+added" in patch and "README" not in patch


def test_snapshot_and_fork_where_the_backend_can(host: Host, ws: Workstation):
    if not isinstance(host.backend, Snapshots):
        with pytest.raises(WorkstationError, match="has no snapshots"):
            snapshots_of(host.backend)
        with pytest.raises(WorkstationError, match="cannot snapshot or fork"):
            snapshotting(ws)
        return
    assert isinstance(ws, SnapshotWorkstation)
    snapper = snapshots_of(host.backend)
    ws.put(b"state\n", "kept.txt")
    snap = snapshotting(ws).snapshot(f"conf-snap-{secrets.token_hex(4)}")
    try:
        assert snap.name in [s.name for s in snapper.snapshots()]
        with snapper.start(snap.name) as restored:
            assert restored.exec("cat kept.txt").stdout == "state\n"
        forks = snapshotting(ws).fork(1)
        try:
            assert forks[0].exec("cat kept.txt").stdout == "state\n"
        finally:
            for fork in forks:
                fork.remove()
    finally:
        snapper.remove_snapshot(snap.name)
    assert snap.name not in [s.name for s in snapper.snapshots()]


def test_info_stop_remove_close(host: Host):
    ws = host.backend.create(host.spec(), name=f"conf-{secrets.token_hex(4)}", persistent=True)
    try:
        info = ws.info()
        assert (info.name, info.id, info.persistent) == (ws.name, ws.id, True)
        with pytest.raises(InvalidInput, match="network mode none"):
            ws.egress_log()
        assert ws.attach_command().argv
        ws.put(b"1\n", "f")
        ws.stop()
        assert ws.exec("cat f").stdout == "1\n"  # the next exec starts it again; files stay
        ws.close()  # persistent: stays
        assert host.backend.open(ws.name).id == ws.id
    finally:
        ws.remove()
    with pytest.raises(WorkstationNotFound):
        host.backend.open(ws.name)
    ws.close()  # idempotent after remove


def test_close_removes_a_scoped_workstation(host: Host):
    with host.backend.create(host.spec()) as ws:
        name = ws.name
    ws.close()
    with pytest.raises(WorkstationNotFound):
        host.backend.open(name)


def test_the_local_backend_is_only_used_when_asked_for():
    from hybrid import tiers
    from hybrid.workstation.docker import DockerBackend
    from hybrid.workstation.local import LocalBackend

    assert isinstance(make_backend(), DockerBackend)
    assert isinstance(make_backend("local"), LocalBackend)
    assert "local" not in tiers.names()  # so neither the router nor --tier can pick it
    with pytest.raises(PolicyViolation, match="no egress proxy"):
        LocalBackend().create(SandboxSpec(network={"mode": "egress", "allow": ["example.com"]}))  # type: ignore[arg-type]
