"""Escape attacks on every tier: network, host secrets, paths, the root filesystem, privileges."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

import pytest
from hostile_kit import (
    Attack,
    Driver,
    Listener,
    Row,
    WorkstationDriver,
    git,
    host_addresses,
    host_secret_line,
    hybrid_cli,
)

from hybrid.errors import HybridError, PolicyViolation
from hybrid.policy import Mount, SandboxSpec, admit

pytestmark = pytest.mark.timeout(300)


def heredoc(script: str) -> str:
    """A Python script as a shell command (process tiers run /bin/sh -c)."""
    return f"python3 - <<'HOSTILE_EOF'\n{script}\nHOSTILE_EOF\n"


def both(sandbox: Driver, script: str, **kwargs: Any) -> Attack:
    """One Python script for python-wasm and every process tier."""
    return Attack(python=script, shell=heredoc(script), **kwargs)


# -- egress -----------------------------------------------------------------------------------------

EGRESS = """
import json
ADDRS, PORT = json.loads({addrs!r}), {port}
lines = []
try:
    import socket
    import urllib.error
    import urllib.request
except ImportError as exc:
    print("network modules unavailable:", exc)
    raise SystemExit(0)

def tcp(a):
    try:
        with socket.create_connection((a, PORT), timeout=2) as s:
            lines.append(f"tcp {{a}} connected {{s.recv(64)!r}}")
    except Exception as e:
        lines.append(f"tcp {{a}} blocked {{type(e).__name__}}")

def http(a):
    host = f"[{{a}}]" if ":" in a else a
    try:
        with urllib.request.urlopen(f"http://{{host}}:{{PORT}}/", timeout=4) as r:
            lines.append(f"http {{a}} connected {{r.status}} {{r.read(64)!r}}")
    except urllib.error.HTTPError as e:
        lines.append(f"http {{a}} refused {{e.code}}")
    except Exception as e:
        lines.append(f"http {{a}} blocked {{type(e).__name__}}")

def dns(name):
    try:
        lines.append(f"dns {{name}} connected {{socket.getaddrinfo(name, 80)[0][4][0]}}")
    except Exception as e:
        lines.append(f"dns {{name}} blocked {{type(e).__name__}}")

jobs = [(f, a) for a in ADDRS for f in (tcp, http)] + [(dns, "example.com")]
try:
    import threading
    import time
    threads = [threading.Thread(target=f, args=(a,), daemon=True) for f, a in jobs]
    for t in threads:
        t.start()
    end = time.monotonic() + 8  # a resolver with no network retries for much longer
    for t in threads:
        t.join(max(end - time.monotonic(), 0))
    lines.extend(f"{{f.__name__}} {{a}} blocked still-waiting" for (f, a), t in zip(jobs, threads) if t.is_alive())
except RuntimeError:  # no threads here (python-wasm): one at a time
    lines.clear()
    for f, a in jobs:
        f(a)
print("\\n".join(sorted(lines)))
"""

REFUSED = ("den", "ref", "block", "forb", "reject")


def _entries(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, dict):
        raw = next((v for v in raw.values() if isinstance(v, list)), [])
    return [e.model_dump(mode="json") if hasattr(e, "model_dump") else dict(e) for e in raw]


def test_egress(sandbox: Driver, listener: Listener) -> None:
    addresses = host_addresses()
    assert addresses, "no host address found to attack"
    if sandbox.kind == "wasi":
        args: list[str] = []
        for a in addresses:
            args += ["connect", f"[{a}]:{listener.port}" if ":" in a else f"{a}:{listener.port}"]
        result = sandbox.run(Attack(wasi=[*args, "resolve", "example.com"]))
        lines = result.stdout.splitlines()
        assert len(lines) == len(addresses) + 1, result
        assert not [line for line in lines if line.endswith(" ok") or " ok:" in line], lines
    else:
        attack = both(sandbox, EGRESS.format(addrs=json.dumps(addresses), port=listener.port))
        result = sandbox.run(attack, wall_seconds=30)
        lines = result.stdout.splitlines()
        assert not [line for line in lines if " connected" in line], lines
        if not result.stdout.startswith("network modules unavailable"):
            assert len(lines) == 2 * len(addresses) + 1, result
    assert listener.peers == [], f"the sandbox reached the host listener from {listener.peers}"

    # The policy: no tier without a network takes egress; no process tier takes a wildcard.
    tier = sandbox.spec_tier
    if tier in ("wasm", "python-wasm", "gvisor"):
        spec = SandboxSpec(network={"mode": "egress", "allow": ["example.com"]})  # type: ignore[arg-type]
        assert admit(spec, tier), f"{tier} admitted egress"
    for pattern in (["*"], ["*:*"]):
        spec = SandboxSpec(network={"mode": "egress", "allow": pattern})  # type: ignore[arg-type]
        assert admit(spec, tier), f"{tier} admitted egress to {pattern}"

    if isinstance(sandbox, WorkstationDriver):
        # Every request the proxy saw is in the log with time, host, port and decision.
        library = _entries(sandbox.ws.egress_log())
        cli = hybrid_cli(["ws", "egress", sandbox.ws.name, "--json"])
        out, err = cli.communicate(timeout=60)
        assert cli.returncode == 0, err.decode()
        shown = _entries(json.loads(out))
        for entries in (library, shown):
            for entry in entries:
                assert {"host", "port", "decision"} <= set(entry), entry
                assert any(k.startswith("time") for k in entry), entry
            proxied = [a for a in addresses if not a.startswith("127.") and a != "::1"]
            for address in proxied:
                seen = [
                    e
                    for e in entries
                    if e["host"].strip("[]") == address and int(e["port"]) == listener.port
                ]
                assert seen, f"no log entry for {address}:{listener.port}: {entries}"
                assert all(str(e["decision"]).lower().startswith(REFUSED) for e in seen), seen


# -- host secrets -----------------------------------------------------------------------------------

SECRETS = """
import os
out = []
for name, value in sorted(os.environ.items()):
    out.append(f"env {{name}}={{value}}")
for path in ("/etc/shadow", {home_ssh!r}, "/root/.ssh", "/var/run/docker.sock", "/run/docker.sock"):
    try:
        if os.path.isdir(path):
            out.append(f"read {{path}} listed {{os.listdir(path)}}")
        else:
            with open(path, "rb") as f:
                out.append(f"read {{path}} opened {{f.read(200)!r}}")
    except Exception as e:
        out.append(f"read {{path}} blocked {{type(e).__name__}}")
try:
    import socket
    for path in ("/var/run/docker.sock", "/run/docker.sock"):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(2)
            s.connect(path)
            out.append(f"unix {{path}} connected")
        except Exception as e:
            out.append(f"unix {{path}} blocked {{type(e).__name__}}")
except ImportError:
    out.append("unix sockets unavailable")
print("\\n".join(out))
"""


def test_host_secrets(sandbox: Driver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    canary, token = f"canary-{secrets.token_hex(8)}", f"token-{secrets.token_hex(8)}"
    monkeypatch.setenv("HYBRID_HOSTILE_CANARY", canary)
    monkeypatch.setenv("HYBRID_HOSTILE_TOKEN", token)
    home_ssh = str(Path.home() / ".ssh")
    shadow = host_secret_line()
    if sandbox.kind == "wasi":
        args = ["env", ""]
        for path in ("/etc/shadow", "/var/run/docker.sock", "/run/docker.sock"):
            args += ["read", path]
        args += ["list", home_ssh, "list", "/root/.ssh", "list", "/"]
        result = sandbox.run(Attack(wasi=args))
        lines = result.stdout.splitlines()
        assert lines[0].strip() == "env:", lines
        assert all("denied" in line for line in lines[1:]), lines
    else:
        result = sandbox.run(both(sandbox, SECRETS.format(home_ssh=home_ssh)))
        lines = result.stdout.splitlines()
        assert not [
            line for line in lines if line.startswith(("read", "unix")) and "blocked" not in line
        ], lines
    seen = result.stdout + result.stderr
    assert canary not in seen and token not in seen, "a host variable reached the sandbox"
    assert shadow not in seen

    # Asking for them by policy is refused before anything runs, on every tier.
    tier = sandbox.spec_tier
    for source in (home_ssh, "/var/run/docker.sock", "/etc/shadow", str(Path.home())):
        spec = SandboxSpec(mounts=[Mount(source=Path(source), target="/s")])
        assert admit(spec, tier), f"{tier} admitted a mount of {source}"
    inherit = SandboxSpec(
        env={"allow": ["HYBRID_HOSTILE_TOKEN"], "inherit": ["HYBRID_HOSTILE_TOKEN"]}
    )  # type: ignore[arg-type]
    assert admit(inherit, tier), f"{tier} admitted inheriting a credential"

    # Files named by the user pass the same rule as mounts.
    if sandbox.kind == "python":
        with pytest.raises(HybridError):
            sandbox.run(Attack(python="print(open('shadow').read())"), files=[Path("/etc/shadow")])
    elif sandbox.kind == "wasi":
        from hybrid import grep

        with pytest.raises(HybridError):
            grep("root", "/etc/shadow")


# -- path escapes -----------------------------------------------------------------------------------


def _granted(root: Path, canary: str) -> tuple[Path, Path]:
    """A granted directory whose symlinks point out of it, and the secret file they aim at."""
    secret = root / "secret.txt"
    secret.write_text(canary)
    granted = root / "granted"
    granted.mkdir()
    (granted / "inside.txt").write_text("fine")
    (granted / "rel-link").symlink_to("../secret.txt")
    (granted / "abs-link").symlink_to(secret)
    (granted / "shadow-link").symlink_to("/etc/shadow")
    (granted / "dir-link").symlink_to(root)
    return granted, secret


def _planted_repo(root: Path, canary: str) -> Path:
    """A repository whose committed directories became symlinks to host paths in the working
    tree, plus untracked links to a host secret, /etc/shadow and out through `..`."""
    secret_dir = root / "secret-dir"
    secret_dir.mkdir()
    (secret_dir / "secret.txt").write_text(canary)
    repo = root / "planted"
    (repo / "s").mkdir(parents=True)
    (repo / "t").mkdir()
    (repo / "README.md").write_text("# planted\n")
    (repo / "s" / "shadow").write_text("not the host's\n")
    (repo / "t" / "secret.txt").write_text("not the secret\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "dirs")
    for name in ("s", "t"):
        for child in (repo / name).iterdir():
            child.unlink()
        (repo / name).rmdir()
    (repo / "s").symlink_to("/etc")
    (repo / "t").symlink_to(secret_dir)
    (repo / "link").symlink_to(secret_dir / "secret.txt")
    (repo / "shadow").symlink_to("/etc/shadow")
    (repo / "up").symlink_to("../../../../../../../../../../etc")
    return repo


READ_ALL = (
    'for f in {paths}; do echo "== $f"; cat "$f" 2>&1; done; '
    'for l in s t link shadow up; do test -L "$l" && echo "$l-is-link"; done; true'
)


def test_path_escapes(sandbox: Driver, tmp_path: Path, row: Row) -> None:
    canary = f"host-secret-{secrets.token_hex(8)}"
    granted, secret = _granted(tmp_path, canary)
    repo = _planted_repo(tmp_path, canary)
    shadow = host_secret_line()
    mounted = sandbox.spec().model_copy(update={"mounts": [Mount(source=granted, target="/in")]})
    reads = ["/in/inside.txt", "/in/../secret.txt", "/in/../../etc/passwd", "/in/rel-link",
             "/in/abs-link", "/in/shadow-link", "/in/dir-link/secret.txt", str(secret)]  # fmt: skip
    if sandbox.kind in ("wasi", "python"):
        if sandbox.kind == "wasi":
            args = [item for path in reads for item in ("read", path)]
            result = sandbox.run(Attack(wasi=[*args, "list", "/in/.."]), spec=mounted)
            lines = result.stdout.splitlines()
            assert lines[0] == "read ok 4 bytes: fine", lines
            assert all("denied" in line for line in lines[1:]), lines
        else:
            script = (
                f"for p in {[*reads, '../secret.txt', 'shadow-link']!r}:\n"
                "    try:\n"
                "        print(p, 'read', open(p).read())\n"
                "    except Exception as e:\n"
                "        print(p, 'blocked', type(e).__name__)\n"
            )
            result = sandbox.run(Attack(python=script), spec=mounted)
            lines = result.stdout.splitlines()
            assert lines[0] == "/in/inside.txt read fine", lines
            assert all(" blocked " in line for line in lines[1:]), lines
        # A repository is not a thing these tiers take: the router refuses it.
        from hybrid import router

        job = (
            router.Job(command=[str(sandbox.probe)], repo=repo)  # type: ignore[attr-defined]
            if sandbox.kind == "wasi"
            else router.Job(python="print(1)", repo=repo)
        )
        with pytest.raises(PolicyViolation):
            router.route(job, sandbox.tier)  # type: ignore[arg-type]
        seen = result.stdout + result.stderr
        assert canary not in seen and shadow not in seen
        return

    paths = " ".join(
        ["/etc/shadow", "s/shadow", "t/secret.txt", "link", "shadow", "up/shadow", *reads]
    )
    attack = Attack(shell=READ_ALL.format(paths=paths))
    if isinstance(sandbox, WorkstationDriver):
        with sandbox.backend.create(mounted, repo=repo) as ws:
            result = sandbox.run(attack, ws=ws)
            _ws_cp(sandbox, ws, granted, tmp_path, canary)
    else:
        from hybrid import router

        job = router.Job(command=["/bin/sh", "-c", attack.shell], repo=repo, spec=mounted)
        result = router.run(job, sandbox.tier)  # type: ignore[arg-type]
        row.note(result)
    seen = result.stdout + result.stderr
    assert canary not in seen, "a host file came in through a symlink"
    assert shadow not in seen, "the host's /etc/shadow came in"
    assert "== /in/inside.txt\nfine" in result.stdout, result.stdout
    for link in ("s", "t", "link", "shadow", "up"):
        assert f"{link}-is-link" in result.stdout, f"the repository's symlink {link} was not kept"


def _inside(root: Path) -> list[str]:
    """Paths under ``root`` that resolve outside it (through a symlink)."""
    real = root.resolve()
    return [
        str(p)
        for p in root.rglob("*")
        if p.is_symlink() and real not in [p.resolve(), *p.resolve().parents]
    ]


def _ws_cp(sandbox: WorkstationDriver, ws: Any, granted: Path, tmp_path: Path, canary: str) -> None:
    """`ws cp` both ways with planted symlinks: nothing is read or written outside either side."""
    ws.put(granted, "cpin")
    got = sandbox.run(
        Attack(shell="cat cpin/rel-link cpin/abs-link cpin/dir-link/secret.txt 2>&1; true"), ws=ws
    )
    assert canary not in got.stdout, "ws cp in followed a symlink on the host"
    for dest in ("../../etc/evil", "/etc/evil"):
        with pytest.raises(HybridError):
            ws.put(b"x", dest)
    plant = (
        "mkdir -p out && echo fine > out/ok.txt && ln -s /etc/passwd out/abs && "
        "ln -s ../../../../../../../etc/passwd out/rel && ln -s / out/root"
    )
    assert sandbox.run(Attack(shell=plant), ws=ws).ok
    dest = tmp_path / "cpout"
    with contextlib.suppress(HybridError):  # refused with a clear error: fine
        ws.get("out", dest)
    assert _inside(dest) == [], "ws cp out extracted a link pointing outside its destination"
    dest2 = tmp_path / "cpout-cli"
    cli = hybrid_cli(["ws", "cp", f"{ws.name}:out", str(dest2)])
    _, err = cli.communicate(timeout=120)
    text = err.decode()
    if cli.returncode != 0:
        assert "Traceback" not in text and len(text.strip().splitlines()) == 1, text
    assert _inside(dest2) == [] if dest2.exists() else True


# -- read-only root ---------------------------------------------------------------------------------


def test_read_only_root(sandbox: Driver) -> None:
    script = (
        "for p in ('/evil', '/etc/evil', '/usr/evil', 'evil'):\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        print(p, 'written')\n"
        "    except OSError as e:\n"
        "        print(p, 'denied', type(e).__name__)\n"
    )
    attack = Attack(
        wasi=["write", "/evil", "write", "/etc/evil", "write", "/workspace/ok"],
        python=script,
        shell=(
            "for p in /evil /etc/evil /usr/evil /bin/evil /var/evil; do "
            '(echo x > $p) 2>/dev/null && echo "$p written" || echo "$p denied"; done; '
            "echo x > /workspace/ok && echo 'workspace written'"
        ),
    )
    result = sandbox.run(attack)
    lines = result.stdout.splitlines()
    if sandbox.kind == "wasi":
        assert lines[0].startswith("write denied") and lines[1].startswith("write denied"), lines
        assert lines[2] == "write ok", lines
    elif sandbox.kind == "python":
        assert len(lines) == 4 and all(" denied " in line for line in lines), lines
    else:
        assert lines[:5] == [
            f"{p} denied" for p in ("/evil", "/etc/evil", "/usr/evil", "/bin/evil", "/var/evil")
        ], lines
        assert lines[5] == "workspace written", lines


# -- privilege --------------------------------------------------------------------------------------

# Only WASI can be linked: a module importing anything else does not start.
PRIVILEGED_MODULE = """(module
  (import "linux" "mount" (func $mount (param i32 i32 i32 i32 i32) (result i32)))
  (import "linux" "setuid" (func $setuid (param i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start") (drop (call $setuid (i32.const 0)))))"""

PRIVILEGE = """
import os
results = []
def attempt(name, fn):
    try:
        rc = fn()
        results.append(f"{name} {'ALLOWED' if rc == 0 else 'denied rc=' + str(rc)}")
    except Exception as e:
        results.append(f"{name} denied {type(e).__name__}")
attempt("setuid", lambda: os.setuid(0) or 0)
attempt("setgid", lambda: os.setgid(0) or 0)
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    attempt("mount", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
    attempt("unshare_mount_ns", lambda: libc.unshare(0x00020000))
    attempt("chroot", lambda: libc.chroot(b"/tmp"))
    # The test runner's own pid on the host: outside the sandbox's pid namespace.
    attempt("ptrace_attach_host", lambda: libc.ptrace(16, {host_pid}, None, None))
    attempt("init_module", lambda: libc.syscall(175, None, 0, b""))
    attempt("finit_module", lambda: libc.syscall(313, 0, b"", 0))
    attempt("kexec_load", lambda: libc.syscall(246, 0, 0, None, 0))
    attempt("reboot", lambda: libc.syscall(169, 0xfee1dead, 672274793, 0x4321fedc, None))
except ImportError as e:
    results.append(f"ctypes denied {type(e).__name__}")
try:
    import socket
    attempt("raw_socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close() or 0)
    attempt("packet_socket", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close() or 0)
except ImportError as e:
    results.append(f"socket denied {type(e).__name__}")
try:
    status = open("/proc/self/status").read()
    for key in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp"):
        results.extend(f"status {line}" for line in status.splitlines() if line.startswith(key + ":"))
except OSError as e:
    results.append(f"status denied {type(e).__name__}")
print("\\n".join(results))
"""


SENTRY_INTERNAL = {"gvisor": {"unshare_mount_ns"}}
"""Calls a tier answers inside its own kernel: gVisor's sentry gives a sandbox its own mount
namespace without any host syscall (mount itself stays denied)."""


def test_privilege(sandbox: Driver, row: Row) -> None:
    if sandbox.kind == "wasi":
        result = sandbox.run(Attack(module=PRIVILEGED_MODULE))
        assert "unknown import" in result.detail or "linux" in result.detail, result
        return
    result = sandbox.run(both(sandbox, PRIVILEGE.replace("{host_pid}", str(os.getpid()))))
    lines = result.stdout.splitlines()
    assert lines, result
    allowed = {line.split()[0] for line in lines if "ALLOWED" in line}
    assert allowed <= SENTRY_INTERNAL.get(sandbox.tier, set()), lines
    if sandbox.kind == "process":
        status = {
            line.split()[1].rstrip(":"): line.split()[2]
            for line in lines
            if line.startswith("status ")
        }
        assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0, status
        assert status.get("NoNewPrivs", "1") == "1", status  # gVisor does not report it
    # A setuid binary cannot raise privileges either (no-new-privileges, no capabilities).
    if sandbox.kind == "process":
        setuid = sandbox.run(
            Attack(
                shell="for b in /bin/su /usr/bin/su /usr/bin/passwd /bin/mount; do test -u $b && $b --version >/dev/null 2>&1; done; id -u"
            )
        )
        assert setuid.stdout.strip().splitlines()[-1] != "0", setuid


def test_policy_refuses_before_running(sandbox: Driver) -> None:
    """The structural answer shared by every tier: an inadmissible spec never starts."""
    bad = SandboxSpec(mounts=[Mount(source=Path("/var/run/docker.sock"), target="/d")])
    with pytest.raises(PolicyViolation):
        sandbox.run(
            Attack(wasi=["print", "ran"], python="print('ran')", shell="echo ran"),
            spec=bad.model_copy(update={"tier": sandbox.spec_tier}),
        )
