"""Services ([[services]]) on the real engine: reachable from their workstation only, their data
in snapshots, and nothing left behind on any path (down, gc, a killed client).

Queries run from inside the workstation with a stdlib client (data/pgclient.py) over the
DATABASE_URL the workstation was given: the same path an agent's test suite takes.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hybrid.errors import PolicyViolation
from hybrid.policy import Budget, SandboxSpec, Service, admit
from hybrid.results import Termination
from hybrid.workstation.docker import client
from hybrid.workstation.services import image_of

pytestmark = pytest.mark.engine

PGCLIENT = (Path(__file__).parent / "data" / "pgclient.py").read_bytes()
REDIS_PING = textwrap.dedent(
    """
    import os, socket, sys
    from urllib.parse import urlparse
    url = urlparse(os.environ["REDIS_URL"])
    s = socket.create_connection((url.hostname, url.port), timeout=5)
    for line in sys.argv[1:]:
        s.sendall(line.encode() + b"\\r\\n")
        print(s.recv(1024).decode().strip())
    """
)


def _port() -> int:
    # Unusual ports: a hit from the host cannot be some other server on the default port.
    return 20000 + secrets.randbelow(20000)


def _spec(*services: Service) -> SandboxSpec:
    budget = Budget(wall_seconds=60, memory="256M", pids=64)
    return SandboxSpec(tier="docker", budget=budget, services=list(services))


@pytest.fixture(scope="module")
def service_images(engine) -> None:  # type: ignore[no-untyped-def]
    """The postgres and redis images (scripts/engine.sh builds them); a failure when missing
    under HYBRID_REQUIRE_ENGINE=1."""
    from hybrid.workstation import images

    for kind in ("postgres", "redis"):
        tag = image_of(Service(kind=kind))  # type: ignore[arg-type]
        if images.get(tag) is None:
            message = (
                f"the service image {tag} is missing (hybrid image bootstrap --service {kind})"
            )
            if os.environ.get("HYBRID_REQUIRE_ENGINE") == "1":
                pytest.fail(message, pytrace=False)
            pytest.skip(message)


def _sql(ws, sql: str):  # type: ignore[no-untyped-def]
    ws.put(PGCLIENT, ".pgclient.py")
    return ws.exec(["python3", ".pgclient.py", sql])


def _leftovers(name: str) -> list[str]:
    api = client().api
    found = [
        c["Names"][0] for c in api.containers(all=True, filters={"label": f"hybrid.name={name}"})
    ]
    volumes = api.volumes(filters={"label": f"hybrid.name={name}"}).get("Volumes") or []
    found += [v["Name"] for v in volumes]
    return found


def test_reachable_from_its_workstation_only(engine, service_images):
    pg, rd = _port(), _port()
    spec = _spec(Service(kind="postgres", port=pg), Service(kind="redis", port=rd))
    started = time.monotonic()
    with engine.create(spec) as ws, engine.create(_spec()) as other:
        ready = time.monotonic() - started
        env = ws.exec("env").stdout
        assert f"DATABASE_URL=postgresql://hybrid:hybrid@127.0.0.1:{pg}/hybrid" in env
        assert f"PGPORT={pg}" in env and f"REDIS_URL=redis://127.0.0.1:{rd}/0" in env

        made = _sql(ws, "CREATE TABLE t (v text); INSERT INTO t VALUES ('hi'); SELECT v FROM t")
        assert made.ok, made.stderr
        assert made.stdout == "hi\n"
        pong = ws.exec(["python3", "-c", REDIS_PING, "PING", "SET k v", "GET k"])
        assert pong.ok, pong.stderr
        assert pong.stdout.split() == ["+PONG", "+OK", "$1"] or pong.stdout.startswith("+PONG")

        # Its namespace holds only lo, with no route: nothing leaves, and there is no address
        # anything outside could reach it on.
        devices = ws.exec("cat /proc/net/dev").stdout
        assert [line.split(":")[0].strip() for line in devices.splitlines()[2:]] == ["lo"]
        assert ws.exec("cat /proc/net/route").stdout.count("\n") <= 1

        # Another workstation: its 127.0.0.1 is its own; nothing listens there.
        probe = f"import socket; socket.create_connection(('127.0.0.1', {pg}), timeout=3)"
        refused = other.exec(["python3", "-c", probe])
        assert refused.termination is Termination.NONZERO_EXIT
        assert "ConnectionRefused" in refused.stderr

        # The host: neither its loopback nor any address of the service's container.
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", pg), timeout=3)
        api = client().api
        for row in api.containers(filters={"label": f"hybrid.name={ws.name}"}):
            attrs = api.inspect_container(row["Id"])
            networks = attrs["NetworkSettings"]["Networks"] or {}
            assert not [n for n in networks.values() if n.get("IPAddress")], attrs["Name"]
            if attrs["Config"]["Labels"].get("hybrid.kind") == "service":
                host = attrs["HostConfig"]
                assert host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"]
                assert "no-new-privileges" in host["SecurityOpt"]
                assert host["PidsLimit"] and host["Memory"]
                assert attrs["Config"]["User"] not in ("", "0", "root")

        # ws ls shows them.
        info = engine.open(ws.name).info()
        assert {(s.name, s.port, s.status) for s in info.services} == {
            ("postgres", pg, "running"),
            ("redis", rd, "running"),
        }
        assert ready < 60
        name = ws.name
    assert _leftovers(name) == []


def test_a_deadline_kill_keeps_the_services(engine, service_images):
    with engine.create(_spec(Service(kind="redis", port=_port()))) as ws:
        assert ws.exec(["python3", "-c", REDIS_PING, "SET k kept"]).ok
        assert ws.exec("sleep 30", timeout=1).termination is Termination.TIMEOUT
        # The workstation started again joins the same namespace: the service is still there.
        back = ws.exec(["python3", "-c", REDIS_PING, "GET k"])
        assert back.ok and "kept" in back.stdout, back


def test_service_data_survives_snapshot_and_start(engine, service_images):
    spec = _spec(Service(kind="postgres", port=_port()), Service(kind="redis", port=_port()))
    snap = f"svc-{secrets.token_hex(3)}"
    snapshots = engine
    with engine.create(spec) as ws:
        assert _sql(ws, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before')").ok
        assert _sql(ws, "CREATE TABLE dropped (v text)").ok
        assert _sql(ws, "DROP TABLE dropped").ok
        assert ws.exec(["python3", "-c", REDIS_PING, "SET k snap"]).ok
        ws.snapshot(snap)
        # Changes after the snapshot stay out of it.
        assert _sql(ws, "INSERT INTO kept VALUES ('after')").ok
    try:
        with snapshots.start(snap) as restored:
            rows = _sql(restored, "SELECT v FROM kept ORDER BY v")
            assert rows.ok and rows.stdout == "before\n", rows
            gone = _sql(restored, "SELECT 1 FROM dropped")
            assert not gone.ok and "does not exist" in gone.stderr
            got = restored.exec(["python3", "-c", REDIS_PING, "GET k"])
            assert got.ok and "snap" in got.stdout, got
    finally:
        snapshots.remove_snapshot(snap)
    api = client().api
    left = api.images(filters={"label": f"hybrid.snapshot={snap}"})
    assert left == [], left


def test_killed_client_leaves_nothing_after_gc(engine, service_images, tmp_path):
    name = f"svc-kill-{secrets.token_hex(3)}"
    script = textwrap.dedent(
        f"""
        import time
        from hybrid.policy import Budget, SandboxSpec, Service
        from hybrid.workstation import backend
        spec = SandboxSpec(tier="docker", budget=Budget(memory="256M"),
                           services=[Service(kind="postgres", port={_port()})])
        ws = backend().create(spec, name="{name}")
        print("up", flush=True)
        time.sleep(600)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "up"
        assert len(_leftovers(name)) >= 4  # workstation, holder, service, their volumes
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    engine.reap()
    engine.gc()
    assert _leftovers(name) == []


def test_killed_during_create_leaves_nothing_after_gc(engine, service_images):
    # Killed while the service is starting: a persistent (ws up) holder and service with no
    # workstation yet; gc removes them once their maker is gone.
    name = f"svc-mid-{secrets.token_hex(3)}"
    script = textwrap.dedent(
        f"""
        from hybrid.policy import Budget, SandboxSpec, Service
        from hybrid.workstation import backend
        spec = SandboxSpec(tier="docker", budget=Budget(memory="256M"),
                           services=[Service(kind="postgres", port={_port()})])
        backend().create(spec, name="{name}", persistent=True)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        api = client().api
        end = time.monotonic() + 60
        while time.monotonic() < end and not api.containers(
            filters={"label": [f"hybrid.name={name}", "hybrid.kind=service"]}
        ):
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _leftovers(name)
    engine.gc()
    assert _leftovers(name) == []


def test_down_from_the_cli_removes_everything(engine, service_images, hybrid_cli):
    name = f"svc-cli-{secrets.token_hex(3)}"
    code, out, err = hybrid_cli("ws", "up", name, "--service", "redis", "--json")
    try:
        assert code == 0, err
        shown = json.loads(out)
        assert [s["name"] for s in shown["services"]] == ["redis"]
        code, out, _ = hybrid_cli("ws", "ls", "--json")
        listed = {w["name"]: w for w in json.loads(out)["workstations"]}
        assert listed[name]["services"][0]["status"] == "running"
        code, out, _ = hybrid_cli("ws", "exec", name, "--", "sh", "-c", "echo $REDIS_URL")
        assert out.strip() == "redis://127.0.0.1:6379/0"
    finally:
        code, _, err = hybrid_cli("ws", "down", name)
    assert code == 0, err
    assert _leftovers(name) == []


def test_services_refused_where_unreachable(engine):
    spec = SandboxSpec(tier="gvisor", services=[Service(kind="postgres")])
    problems = admit(spec)
    assert any("gVisor" in p and "docker tier" in p for p in problems), problems
    with pytest.raises(PolicyViolation):
        engine.create(spec)


def test_any_local_image_as_a_service(engine):
    # kind image: the base image serving HTTP, its own health check, a data directory.
    port = _port()
    serve = ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", "/srv/data"]
    ping = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/')"
    service = Service(
        kind="image",
        name="web",
        image="hybrid/base:bookworm",
        port=port,
        command=serve,
        health=["python3", "-c", ping],
        data="/srv/data",
    )
    with engine.create(_spec(service)) as ws:
        got = ws.exec(
            [
                "python3",
                "-c",
                f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/').status)",
            ]
        )
        assert got.ok and got.stdout == "200\n", got
        assert [s.status for s in ws.info().services] == ["running"]


def test_services_with_egress_share_the_relay_namespace(engine, service_images):
    # Egress mode: the workstation's namespace is the relay's (only lo); the service joins it.
    from hybrid.policy import NetworkPolicy

    spec = _spec(Service(kind="redis", port=_port())).model_copy(
        update={"network": NetworkPolicy(mode="egress", allow=["example.org"])}
    )
    with engine.create(spec) as ws:
        pong = ws.exec(["python3", "-c", REDIS_PING, "PING"])
        assert pong.ok and pong.stdout.strip() == "+PONG", pong
        devices = ws.exec("cat /proc/net/dev").stdout
        assert [line.split(":")[0].strip() for line in devices.splitlines()[2:]] == ["lo"]
        name = ws.name
    assert _leftovers(name) == []
