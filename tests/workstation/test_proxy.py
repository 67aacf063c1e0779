"""Egress containment: a workstation reaches its proxy and nothing else, and the proxy refuses
loopback, link-local, private, shared, unique-local and the host's own addresses whatever the
allow-list says, logging every request where the workstation cannot touch it.

All traffic stays on this machine: listeners on the host, docker networks this module makes
(their gateways give the host an address in each class) and one target container on a network
in a benchmarking range (198.18.0.0/15, never routed on the internet) that plays "outside".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from click.testing import CliRunner

from hybrid.errors import InvalidInput, PolicyViolation
from hybrid.policy import Budget, NetworkPolicy, SandboxSpec
from hybrid.workstation.proxy import Proxy, _target, allowed, forbidden, host_addresses

# -- the rules, in process ---------------------------------------------------------------------


def test_allow_list_patterns_and_ports():
    patterns = [
        "mirror.example.org:80",
        "*.files.example.net",
        "index.example.com:*",
        "[2001:db8::1]:443",
    ]
    assert allowed("mirror.example.org", 80, patterns)
    assert allowed("MIRROR.example.org.", 80, patterns)
    assert not allowed("mirror.example.org", 443, patterns)
    assert allowed("cdn.files.example.net", 443, patterns)
    assert allowed("index.example.com", 8443, patterns)
    assert allowed("2001:db8::1", 443, patterns)
    assert not allowed("2001:db8::1", 80, patterns)
    assert not allowed("evil.org", 80, patterns)
    assert not allowed("mirror.example.org.evil.org", 80, patterns)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("0.1.2.3", "this-network"),
        ("169.254.169.254", "link-local"),  # cloud metadata
        ("fe80::1%eth0", "link-local"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.254", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "shared (CGNAT)"),
        ("100.127.255.254", "shared (CGNAT)"),
        ("fc00::1", "unique-local"),
        ("fd12:3456::1", "unique-local"),
        ("fec0::1", "site-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("255.255.255.255", "reserved"),
        ("240.0.0.1", "reserved"),
        ("::ffff:127.0.0.1", "carries 127.0.0.1 is loopback"),
        ("::ffff:10.0.0.1", "carries 10.0.0.1 is private"),
        ("::7f00:1", "IPv4-compatible"),
        ("2002:7f00:1::", "carries 127.0.0.1 is loopback"),  # 6to4
        ("64:ff9b::a9fe:a9fe", "carries 169.254.169.254 is link-local"),  # NAT64
        ("203.0.113.7", "an address of the host"),
        ("::ffff:203.0.113.7", "an address of the host"),
    ],
)
def test_forbidden_address_classes(address: str, why: str):
    reason = forbidden(address, ["203.0.113.7"])
    assert reason is not None and why in reason, reason


@pytest.mark.parametrize("address", ["8.8.8.8", "198.18.213.2", "203.0.113.80", "2606:4700::1"])
def test_outside_addresses_pass(address: str):
    assert forbidden(address, ["203.0.113.7"]) is None


def test_request_targets():
    assert _target("CONNECT", "[::1]:443") == ("::1", 443)
    assert _target("CONNECT", "example.com") == ("example.com", 443)
    assert _target("GET", "http://2130706433:81/x") == ("2130706433", 81)
    assert _target("GET", "http://[::ffff:127.0.0.1]/") == ("::ffff:127.0.0.1", 80)
    for method, target in (("GET", "ftp://example.com/"), ("CONNECT", "example.com:http")):
        with pytest.raises(ValueError):
            _target(method, target)


# -- the proxy, in process, against listeners on this host ---------------------------------------


@dataclass
class Listener:
    """TCP and UDP listeners on every host address (0.0.0.0 and ::) recording who arrived."""

    tcp_port: int = 0
    udp_port: int = 0
    arrived: list[str] = field(default_factory=list)
    _socks: list[socket.socket] = field(default_factory=list)

    def start(self) -> Listener:
        tcp = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        tcp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        tcp.bind(("::", 0))
        tcp.listen(64)
        self.tcp_port = tcp.getsockname()[1]
        udp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        udp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        udp.bind(("::", 0))
        self.udp_port = udp.getsockname()[1]
        self._socks = [tcp, udp]
        threading.Thread(target=self._accept, args=(tcp,), daemon=True).start()
        threading.Thread(target=self._receive, args=(udp,), daemon=True).start()
        return self

    def _accept(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, peer = sock.accept()
                self.arrived.append(f"tcp from {peer[0]}")
                conn.close()

    def _receive(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                _, peer = sock.recvfrom(2048)
                self.arrived.append(f"udp from {peer[0]}")

    def close(self) -> None:
        for sock in self._socks:
            sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    made = Listener().start()
    yield made
    made.close()


def _ask(path: str, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(20)
        s.connect(path)
        s.sendall(request)
        return s.recv(200)


def _in_process(allow: list[str], tmp_path) -> tuple[str, list[dict], threading.Event]:  # type: ignore[no-untyped-def]
    events: list[dict] = []
    path = str(tmp_path / "proxy.sock")
    stop = threading.Event()

    async def run() -> None:
        task = asyncio.ensure_future(Proxy(allow, log=events.append).serve(path))
        while not stop.is_set():
            await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    threading.Thread(target=asyncio.run, args=(run(),), daemon=True).start()
    for _ in range(100):
        if os.path.exists(path):
            break
        threading.Event().wait(0.05)
    return path, events, stop


def _loopback_and_host_forms(port: int) -> list[str]:
    forms = ["127.0.0.1", "127.1", "2130706433", "0x7f000001", "0177.0.0.1", "localhost"]
    forms += ["[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "0.0.0.0", "[::]"]
    for address in host_addresses():
        forms.append(f"[{address}]" if ":" in address else address)
    return [f"{form}:{port}" for form in forms]


@pytest.mark.parametrize("pattern", ["*", "*:*"])
def test_in_process_proxy_refuses_this_host_whatever_the_pattern(tmp_path, listener, pattern):
    """A proxy allowed everything still reaches no loopback or host address (each form)."""
    path, events, stop = _in_process([pattern], tmp_path)
    targets = _loopback_and_host_forms(listener.tcp_port)
    try:
        for target in targets:
            assert _ask(
                path, f"GET http://{target}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            ).startswith(b"HTTP/1.1 403"), target
            assert _ask(path, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode()).startswith(
                b"HTTP/1.1 403"
            ), target
    finally:
        stop.set()
    assert listener.arrived == []
    assert len(events) == 2 * len(targets)
    assert {e["decision"] for e in events} == {"deny"}
    assert all(e["reason"] and e["address"] for e in events), events


# -- the real thing: a workstation on the engine -------------------------------------------------

NETS = {  # name suffix -> subnet; each gateway is a host address in that class
    "ten": "10.213.57.0/24",
    "one92": "192.168.213.0/24",
    "cgnat": "100.77.213.0/24",
    "outside": "198.18.213.0/24",
}
TARGET_IP = "198.18.213.2"
TARGET_NAME = "target.egress.test"
TARGET_SERVER = textwrap.dedent(
    """
    import http.server
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            print("peer", self.client_address[0], flush=True)
            body = b"hello from outside"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
    """
)


@dataclass
class Lab:
    tag: str
    gateways: dict[str, str]
    target: str
    networks: list[str]


@pytest.fixture(scope="module")
def lab(engine) -> Iterator[Lab]:  # type: ignore[no-untyped-def]
    """Internal networks (host gateway in each class) and a target server "outside"."""
    from docker.errors import NotFound
    from docker.types import IPAMConfig, IPAMPool

    from hybrid.workstation.docker import client
    from hybrid.workstation.images import BASE_IMAGE

    api = client().api
    tag = f"egress-test-{secrets.token_hex(3)}"
    labels = {"hybrid.test": tag}
    made: list[str] = []
    target = ""
    try:
        gateways = {}
        for suffix, subnet in NETS.items():
            name = f"{tag}-{suffix}"
            gateway = subnet.replace(".0/24", ".1")
            api.create_network(
                name,
                driver="bridge",
                internal=True,
                labels=labels,
                ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=subnet, gateway=gateway)]),
            )
            made.append(name)
            gateways[suffix] = gateway
        outside = f"{tag}-outside"
        target = api.create_container(
            BASE_IMAGE,
            command=["python3", "-c", TARGET_SERVER],
            name=f"{tag}-target",
            labels=labels,
            host_config=api.create_host_config(
                network_mode=outside, read_only=True, cap_drop=["ALL"]
            ),
            networking_config=api.create_networking_config(
                {outside: api.create_endpoint_config(ipv4_address=TARGET_IP, aliases=[TARGET_NAME])}
            ),
        )["Id"]
        api.start(target)
        yield Lab(tag, gateways, target, made)
    finally:
        if target:
            with contextlib.suppress(NotFound):
                api.remove_container(target, force=True)
        for name in made:
            api.remove_network(name)


def _egress_spec(allow: list[str]) -> SandboxSpec:
    return SandboxSpec(
        tier="docker",
        network=NetworkPolicy(mode="egress", allow=allow),
        budget=Budget(wall_seconds=120, memory="256M", pids=64),
    )


REFUSED_HOSTS = [
    "127.0.0.1",
    "localhost",
    "2130706433",
    "[::1]",
    "0.0.0.0",
    "[fc00::1]",
    "[fe80::1]",
    "224.0.0.1",
    "172.17.0.1",  # docker0: the host
]


def _refused(lab: Lab, port: int) -> list[str]:
    """host:port targets the proxy must refuse; each is also its own allow-list pattern."""
    ten = lab.gateways["ten"]
    packed = socket.inet_aton(ten)
    number = int.from_bytes(packed, "big")
    forms = [*REFUSED_HOSTS, *lab.gateways.values()]
    forms += [str(number), hex(number), ".".join(f"0{b:o}" for b in packed)]  # 10.213.57.1
    forms += [f"[::ffff:{ten}]"]  # IPv4-mapped
    forms += [a for a in host_addresses() if ":" not in a and not a.startswith("127.")]
    return [f"{form}:{port}" for form in dict.fromkeys(forms)]


@pytest.fixture(scope="module")
def station(engine, lab):  # type: ignore[no-untyped-def]
    """An egress workstation whose allow-list names every forbidden target explicitly, and the
    target outside; its proxy is attached to the outside network (the test's only route there)."""
    from hybrid.workstation.docker import client

    listener = Listener().start()
    refused = _refused(lab, listener.tcp_port)
    allow = list(refused)
    allow += [f"{TARGET_IP}:8000", f"{TARGET_NAME}:8000"]
    with engine.create(_egress_spec(allow)) as ws:
        client().api.connect_container_to_network(f"hybrid-{ws.name}-proxy", f"{lab.tag}-outside")
        yield ws, listener, refused
    listener.close()


RAW_PROBE = textwrap.dedent(
    """
    import json, socket, sys
    addresses, tcp_port, udp_port = json.loads(sys.argv[1])
    out = {}
    for a in addresses:
        family = socket.AF_INET6 if ":" in a else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM); s.settimeout(3)
        try:
            s.connect((a, tcp_port)); out[a] = "CONNECTED"
        except OSError as e:
            out[a] = type(e).__name__
        u = socket.socket(family, socket.SOCK_DGRAM)
        u.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        for where in ([a] + (["255.255.255.255"] if family == socket.AF_INET else [])):
            try:
                u.sendto(b"hello", (where, udp_port))
            except OSError:
                pass
    out["interfaces"] = [l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]]
    print(json.dumps(out))
    """
)


def test_raw_sockets_reach_no_host_address_and_no_container(station, lab):
    """A program ignoring HTTP_PROXY: every host address, the target container, the proxy's
    bridge address; TCP, UDP and broadcast. Before the fix the gateway accepted."""
    from hybrid.workstation.docker import client

    ws, listener, _ = station
    api = client().api
    proxy = api.inspect_container(f"hybrid-{ws.name}-proxy")["NetworkSettings"]["Networks"]
    addresses = sorted(
        {*host_addresses(), *lab.gateways.values(), TARGET_IP}
        | {n["IPAddress"] for n in proxy.values() if n.get("IPAddress")}
        | {n["Gateway"] for n in proxy.values() if n.get("Gateway")}
    )
    listener.arrived.clear()
    probe = json.dumps([addresses, listener.tcp_port, listener.udp_port])
    result = ws.exec(["python3", "-c", RAW_PROBE, probe], timeout=120)
    assert result.ok, result
    seen = json.loads(result.stdout)
    connected = [a for a in addresses if seen[a] == "CONNECTED"]
    threading.Event().wait(1)  # let a datagram in flight land
    assert connected == [] and listener.arrived == [], (connected, listener.arrived)
    assert seen["interfaces"] == ["lo"], seen
    assert "peer" not in api.logs(lab.target).decode()  # the target saw no one yet


DNS_PROBE = textwrap.dedent(
    """
    import socket
    try:
        socket.getaddrinfo("hybrid-egress-test.invalid", 80)
        print("resolved")
    except OSError as e:
        print("no answer", type(e).__name__)
    servers = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")]
    query = bytes.fromhex("abcd01000001000000000000") + b"\\x05hello\\x07invalid\\x00\\x00\\x01\\x00\\x01"
    for server in servers + ["127.0.0.11"]:
        family = socket.AF_INET6 if ":" in server else socket.AF_INET
        u = socket.socket(family, socket.SOCK_DGRAM)
        u.settimeout(3)
        try:
            u.connect((server, 53))  # a route lookup only: nothing is sent
        except OSError as e:
            print(server, "no route", type(e).__name__)
            continue
        if not server.startswith("127."):
            print(server, "ROUTED")  # never send a query off this machine
            continue
        t = socket.socket(family, socket.SOCK_STREAM)
        t.settimeout(3)
        try:
            t.connect((server, 53)); print(server, "LISTENING")  # a resolver on loopback
        except OSError as e:
            print(server, "nothing on tcp", type(e).__name__)
        try:
            u.send(query); u.recv(512); print(server, "ANSWERED")
        except OSError as e:
            print(server, "no answer", type(e).__name__)
    """
)


def test_dns_from_the_workstation_reaches_nothing(station):
    ws, _, _ = station
    result = ws.exec(["python3", "-c", DNS_PROBE], timeout=60)
    assert result.ok, result
    assert "no answer" in result.stdout.splitlines()[0], result.stdout
    for word in ("ROUTED", "LISTENING", "ANSWERED"):
        assert word not in result.stdout, result.stdout


PROXY_PROBE = textwrap.dedent(
    """
    import json, os, socket, sys, urllib.error, urllib.request
    from urllib.parse import urlsplit
    proxy = urlsplit(os.environ["HTTP_PROXY"])
    os.environ.pop("no_proxy", None); os.environ.pop("NO_PROXY", None)  # localhost too
    out = []
    def connect(target, then=b""):
        try:
            return tunnel(target, then)
        except OSError as e:
            return type(e).__name__, ""
    def tunnel(target, then):
        s = socket.create_connection((proxy.hostname, proxy.port), timeout=30)
        s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
        head = s.recv(4096)
        body = b""
        if head.startswith(b"HTTP/1.1 200") and then:
            s.sendall(then)
            while chunk := s.recv(4096):
                body += chunk
        return head.split(b"\\r\\n")[0].decode(), body.decode(errors="replace")
    for target in json.loads(sys.argv[1]):
        try:
            with urllib.request.urlopen(f"http://{target}/", timeout=30) as r:
                get = (r.status, r.read().decode())
        except urllib.error.HTTPError as e:
            get = (e.code, "")
        except OSError as e:
            get = (type(e).__name__, "")
        out.append([target, get, connect(target, b"GET / HTTP/1.0\\r\\n\\r\\n")])
    print(json.dumps(out))
    """
)


def test_proxy_refuses_every_forbidden_class_and_serves_the_allow_list(station, lab):
    """Each target is on the allow-list by an explicit pattern: loopback, link-local, private,
    CGNAT, unique-local, multicast, the host's addresses (a global one among them), in
    decimal, hex, octal and IPv4-mapped forms. The host listener must see none of them; the
    target outside, named by address or by name, answers; every request is logged."""
    from hybrid.workstation.docker import client

    ws, listener, refused = station
    listener.arrived.clear()
    good = [f"{TARGET_IP}:8000", f"{TARGET_NAME}:8000"]
    off_list = [f"{TARGET_IP}:8001", "evil.example:80"]
    targets = refused + good + off_list
    result = ws.exec(["python3", "-c", PROXY_PROBE, json.dumps(targets)], timeout=300)
    assert result.ok, result
    answers = {target: (get, tunnel) for target, get, tunnel in json.loads(result.stdout)}
    assert listener.arrived == [], listener.arrived
    for shown in refused:
        assert answers[shown] == ([403, ""], ["HTTP/1.1 403 Forbidden", ""]), (
            shown,
            answers[shown],
        )
    for target in good:
        get, tunnel = answers[target]
        assert get == [200, "hello from outside"], (target, get)
        assert tunnel[0] == "HTTP/1.1 200 Connection Established", tunnel
        assert tunnel[1].endswith("hello from outside"), tunnel
    for target in off_list:
        assert answers[target][0][0] == 403, answers[target]

    # Only the proxy reached the target (once per allowed request).
    proxy_ip = client().api.inspect_container(f"hybrid-{ws.name}-proxy")["NetworkSettings"][
        "Networks"
    ][f"{lab.tag}-outside"]["IPAddress"]
    logged = client().api.logs(lab.target, stderr=False).decode().splitlines()
    peers = [line.split()[1] for line in logged if line.startswith("peer ")]
    assert peers == [proxy_ip] * 4, peers

    events = ws.egress_log()
    mine = events[-2 * len(targets) :]
    assert len(events) >= 2 * len(targets)
    decided = {}
    for e in mine:
        shown = f"[{e.host}]:{e.port}" if ":" in e.host else f"{e.host}:{e.port}"
        decided.setdefault(shown, set()).add((e.decision, e.method))
    for shown in refused:
        assert decided[shown] == {("deny", "GET"), ("deny", "CONNECT")}, (shown, decided)
    for target in good:
        assert decided[target] == {("allow", "GET"), ("allow", "CONNECT")}, decided
    for target in off_list:
        assert {d for d, _ in decided[target]} == {"deny"}
    reasons = {e.reason for e in mine if e.decision == "deny"}
    for word in ("loopback", "private", "shared (CGNAT)", "unique-local", "link-local",
                 "multicast", "unspecified", "an address of the host", "not on the allow-list"):  # fmt: skip
        assert any(word in r for r in reasons), (word, sorted(reasons))
    assert all(e.address == TARGET_IP for e in mine if e.decision == "allow")


def test_the_log_cannot_be_reached_or_forged_from_inside(station):
    ws, _, _ = station
    forged = 'x","decision":"allow","port":1}\\n{"host":"y'
    probe = textwrap.dedent(
        f"""
        import os, socket
        print(sorted(p for p in ["/run/hybrid-egress", "/var/run/docker.sock", "/run/docker.sock"] if os.path.exists(p)))
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        s.sendall(b'CONNECT {forged}:443 HTTP/1.1\\r\\n\\r\\n')
        print(s.recv(100).split(b"\\r\\n")[0].decode())
        """
    )
    before = len(ws.egress_log())
    result = ws.exec(["python3", "-c", probe])
    lines = result.stdout.splitlines()
    assert lines[0] == "[]" and lines[1] in ("HTTP/1.1 400 Bad Request", "HTTP/1.1 403 Forbidden")
    after = ws.egress_log()
    assert len(after) == before + 1  # one request, one event: the text did not become two
    assert after[-1].decision == "deny", after[-1]
    assert "allow" in after[-1].host + after[-1].reason, after[-1]

    from hybrid.workstation.docker import client

    config = client().api.inspect_container(f"hybrid-{ws.name}-proxy")["HostConfig"]["LogConfig"]
    assert config == {"Type": "json-file", "Config": {"max-file": "2", "max-size": "1m"}}


HALF_CLOSE = textwrap.dedent(
    f"""
    import socket
    s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
    s.sendall(b"CONNECT {TARGET_IP}:8000 HTTP/1.1\\r\\n\\r\\n")
    assert s.recv(100).startswith(b"HTTP/1.1 200")
    s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
    s.shutdown(socket.SHUT_WR)  # the client is done talking; the answer must still come back
    body = b""
    while chunk := s.recv(4096):
        body += chunk
    print(body.split(b"\\r\\n\\r\\n", 1)[1].decode())
    print([l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]])
    """
)


def test_half_close_and_a_restarted_workstation(station):
    """A client that shuts its sending side still gets the answer; after the workstation is
    stopped (as a deadline does) and started again it is back in the same lo-only namespace."""
    ws, _, _ = station
    for _ in range(2):
        result = ws.exec(["python3", "-c", HALF_CLOSE], timeout=60)
        assert result.stdout.splitlines() == ["hello from outside", "['lo']"], result
        ws.stop()


def test_cli_shows_the_egress_log(station):
    from hybrid.cli import cli

    ws, _, _ = station
    runner = CliRunner()
    shown = runner.invoke(cli, ["ws", "egress", ws.name, "--json"])
    assert shown.exit_code == 0, shown.output
    events = json.loads(shown.stdout)
    assert events and {"time", "host", "port", "decision", "reason"} <= set(events[0])
    assert len(events) == len(ws.egress_log())
    table = runner.invoke(cli, ["ws", "egress", ws.name])
    assert table.exit_code == 0 and "deny" in table.stdout
    listed = runner.invoke(cli, ["ws", "ls", "--json"])
    mine = [w for w in json.loads(listed.stdout)["workstations"] if w["name"] == ws.name]
    assert mine[0]["egress_events"] == len(events)


def test_egress_log_of_a_workstation_without_network(engine):
    with engine.create(SandboxSpec(tier="docker")) as ws:
        with pytest.raises(InvalidInput):
            ws.egress_log()
        assert ws.info().egress_events is None
        shown = subprocess.run(
            [sys.executable, "-m", "hybrid", "ws", "egress", ws.name],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 2, shown
        assert len(shown.stderr.strip().splitlines()) == 1, shown.stderr
        assert "network mode none" in shown.stderr


def test_gvisor_refuses_egress(engine):
    spec = SandboxSpec(tier="gvisor", network=NetworkPolicy(mode="egress", allow=["example.com"]))
    with pytest.raises(PolicyViolation, match="network=none"):
        engine.create(spec)


def _leftovers(name: str) -> list[str]:
    from hybrid.workstation.docker import client

    api = client().api
    found = [
        c["Names"][0] for c in api.containers(all=True, filters={"label": f"hybrid.name={name}"})
    ]
    found += [
        v["Name"]
        for v in api.volumes(filters={"label": f"hybrid.name={name}"}).get("Volumes") or []
    ]
    found += [n["Name"] for n in api.networks(filters={"label": f"hybrid.name={name}"})]
    return found


def test_removal_and_gc_leave_nothing(engine, tmp_path):
    """Removing a workstation removes its relay, proxy and socket volume; gc reaps those a
    killed client or a half-finished removal left behind."""
    from hybrid.workstation.docker import client

    with engine.create(_egress_spec(["example.com"])) as ws:
        name = ws.name
        assert len(_leftovers(name)) == 5  # workstation, relay, proxy, workspace, socket volume
    assert _leftovers(name) == []

    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal, sys
            from hybrid.workstation import backend
            from hybrid.policy import NetworkPolicy, SandboxSpec
            spec = SandboxSpec(tier="docker", network=NetworkPolicy(mode="egress", allow=["example.com"]))
            ws = backend().create(spec, persistent=sys.argv[1] == "kept")
            print(ws.name, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
            """
        )
    )
    names = {}
    for how in ("scoped", "kept"):
        proc = subprocess.run(
            [sys.executable, str(script), how], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        names[how] = proc.stdout.strip()
    # A kept workstation whose container went (removed by hand, or a crash inside `ws down`).
    client().api.remove_container(f"hybrid-{names['kept']}", force=True)
    report = engine.gc()
    for name in names.values():
        assert _leftovers(name) == []
        assert f"hybrid-{name}-proxy" in report.containers
        assert f"hybrid-{name}-relay" in report.containers
        assert f"hybrid-{name}-egress" in report.volumes
