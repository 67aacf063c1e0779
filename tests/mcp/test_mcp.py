"""`hybrid mcp` driven by the official SDK's own client, over stdio and streamable HTTP.

Both protocol eras the SDK speaks run: ``legacy`` (the initialize handshake; sessions) and
``auto`` (the 2026 stateless protocol, which this SDK picks by default).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parent.parent.parent


def server_env() -> dict[str, str]:
    """The test process's environment with this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def server_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "hybrid", "mcp", *args]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small repository: a module with a function and its test."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "shipping.py").write_text(
        '"""Shipping costs."""\n\n\ndef cost(weight: float) -> float:\n'
        '    """The cost of a parcel."""\n    return 5.0 + 2.0 * weight\n'
    )
    (root / "test_shipping.py").write_text(
        "from pkg.shipping import cost\n\n\ndef test_cost():\n    assert cost(1) == 7.0\n"
    )
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server(repo: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`hybrid mcp --transport http` on a free loopback port (idle time 3 s); its URL."""
    port = free_port()
    proc = subprocess.Popen(
        server_argv(
            "--transport", "http", "--port", str(port), "--root", str(repo), "--idle", "3", "--json"
        ),
        env=server_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    url = json.loads(proc.stdout.readline())["url"]
    assert url == f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                _, err = proc.communicate()
                pytest.fail(f"the HTTP server did not start: {err.decode()[-2000:]}")
            time.sleep(0.1)
    try:
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


TOOLS = {
    "repo_map",
    "context_pack",
    "skeleton",
    "run_check",
    "run_python",
    "ws_create",
    "ws_exec",
    "ws_read_file",
    "ws_write_file",
    "ws_diff",
    "ws_snapshot",
    "ws_destroy",
    "gate_patch",
    "solve",
}
MODES = ["legacy", "auto"]


def http_client(url: str, **options: Any) -> Client:
    """An SDK client of the HTTP server that sends its token (the server runs with this
    session's state directory, so its token file is the one ``auth.token_path()`` names)."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    from hybrid.mcp import auth

    token = auth.token_path().read_text().strip()
    headers = {auth.HEADER: f"Bearer {token}"}
    transport = streamable_http_client(url, http_client=create_mcp_http_client(headers=headers))
    return Client(transport, **options)


def stdio(*args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=server_argv(*args)[1:], env=server_env(), cwd=str(REPO)
    )


def body(result: Any) -> Any:
    """The one JSON text result of a call."""
    assert len(result.content) == 1 and result.content[0].type == "text"
    return json.loads(result.content[0].text)


def error(result: Any) -> dict[str, Any]:
    assert result.is_error, result.content
    found: dict[str, Any] = body(result)["error"]
    return found


@pytest.mark.parametrize("mode", MODES)
def test_stdio_session_maps_runs_and_refuses(repo: Path, mode: str) -> None:
    (repo / "leak.py").symlink_to("/etc/hostname")
    (repo / "pkg" / "mode.py").write_text(f"MODE = {mode!r}\n")  # new contents to index
    logs: list[Any] = []

    async def on_log(params: Any) -> None:
        logs.append(params)

    async def session() -> None:
        server = stdio("--root", str(repo))
        async with Client(server, mode=mode, logging_callback=on_log, log_level="info") as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS

            mapped = body(await client.call_tool("repo_map", {"task": "shipping cost"}))
            assert mapped["entries"][0]["path"] == "pkg/shipping.py"
            assert "def cost" in mapped["text"]
            # The index's progress reaches the client as log lines.
            assert any(p.logger == "progress" and "indexed" in str(p.data) for p in logs), logs

            skeleton = body(await client.call_tool("skeleton", {"path": "pkg/shipping.py"}))
            assert "def cost(weight: float) -> float:" in skeleton["skeleton"]
            assert "2.0 * weight" not in skeleton["skeleton"]

            pack = body(await client.call_tool("context_pack", {"task": "change the cost"}))
            assert any(item["path"] == "pkg/shipping.py" for item in pack["items"])

            run = await client.call_tool(
                "run_python",
                {
                    "source": "def double(x):\n    return 2 * x\nprint(double(21))",
                    "tests": "assert double(2) == 4\n\ndef test_zero():\n    assert double(0) == 0\n",
                },
            )
            result = body(run)
            assert not run.is_error and result["stdout"] == "42\n"
            assert [t["passed"] for t in result["tests"]] == [True, True]

            failing = body(await client.call_tool("run_python", {"source": "1/0"}))
            assert failing["termination"] == "nonzero_exit" and "ZeroDivisionError" in (
                failing["traceback"] or ""
            )

            csv = body(
                await client.call_tool(
                    "run_check",
                    {"check": "csv", "text": "a,b\n1,2\n", "options": {"require": ["a"]}},
                )
            )
            assert csv["ok"] is True

            # Failures are isError results carrying the HybridError, not protocol errors.
            wide = error(
                await client.call_tool("run_python", {"source": "pass", "timeout_seconds": 1e6})
            )
            assert wide["type"] == "PolicyViolation" and wide["exit_code"] == 3
            assert "above the server's budget" in wide["message"]
            bad = error(await client.call_tool("run_check", {"check": "grep", "pattern": "("}))
            assert bad["type"] == "InvalidPattern"
            missing = error(
                await client.call_tool("ws_exec", {"workstation": "x", "command": "id"})
            )
            assert missing["type"] == "WorkstationNotFound"
            host_file = error(
                await client.call_tool(
                    "run_check",
                    {"check": "json", "text": "{}", "options": {"schema": "/etc/passwd"}},
                )
            )
            assert host_file["type"] == "InvalidInput"
            no_model = error(await client.call_tool("solve", {"task": "x", "tests": "pass"}))
            assert "needs a model" in no_model["message"]

            # Paths outside the roots are refused, symlinks judged by where they lead.
            for tool, args in [
                ("repo_map", {"root": "/etc"}),
                ("repo_map", {"root": "../.."}),
                ("skeleton", {"path": "/etc/passwd"}),
                ("skeleton", {"path": "leak.py"}),
                ("run_check", {"check": "grep", "pattern": "root", "path": "/etc"}),
                ("run_check", {"check": "csv", "path": "/etc/passwd"}),
            ]:
                refused = error(await client.call_tool(tool, args))
                assert refused["type"] == "PolicyViolation", (tool, args, refused)
                assert "outside the server's roots" in refused["message"]

    anyio.run(session)


def test_policy_is_obeyed(repo: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('tier = "gvisor"\n[budget]\nwall_seconds = 5\nfuel = 100000000\n')

    async def session() -> None:
        async with Client(stdio("--root", str(repo), "--policy", str(policy))) as client:
            refused = error(await client.call_tool("run_python", {"source": "print(1)"}))
            assert (
                refused["type"] == "PolicyViolation"
                and "only the gvisor tier" in refused["message"]
            )
            docker = error(await client.call_tool("ws_create", {"tier": "docker"}))
            assert "only the gvisor tier" in docker["message"]

    anyio.run(session)

    policy.write_text("[budget]\nwall_seconds = 5\nfuel = 100000000\n")

    async def fuel() -> None:
        async with Client(stdio("--root", str(repo), "--policy", str(policy))) as client:
            spin = body(await client.call_tool("run_python", {"source": "while True: pass"}))
            assert spin["termination"] == "out_of_fuel"
            longer = error(
                await client.call_tool("run_python", {"source": "pass", "timeout_seconds": 6})
            )
            assert "above the server's budget of 5 s" in longer["message"]

    anyio.run(fuel)


def test_solve_runs_the_loop_with_the_servers_model(repo: Path, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.md"
    wrong.write_text("```python\ndef double(x):\n    return x + 2\n```\n")
    right = tmp_path / "right.md"
    right.write_text("```python\ndef double(x):\n    return 2 * x\n```\n")
    logs: list[Any] = []

    async def on_log(params: Any) -> None:
        logs.append(params)

    server = stdio("--root", str(repo), "--answer", str(wrong), "--answer", str(right))

    async def session() -> None:
        async with Client(server, logging_callback=on_log, log_level="info") as client:
            report = body(
                await client.call_tool(
                    "solve",
                    {"task": "write double(x)", "tests": "assert double(3) == 6\n", "steps": 3},
                )
            )
            assert report["stop"] == "solved" and len(report["attempts"]) == 2
            assert "return 2 * x" in report["solution"]
            assert any(p.logger == "progress" for p in logs), logs

    anyio.run(session)


def test_a_root_holding_a_secret_path_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "state").mkdir(parents=True)
    env = {**server_env(), "HYBRID_STATE_DIR": str(root / "state")}
    done = subprocess.run(
        server_argv("--root", str(root)),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "secret path" in done.stderr, done.stderr


def test_http_binds_loopback_only(repo: Path) -> None:
    done = subprocess.run(
        server_argv("--transport", "http", "--host", "0.0.0.0", "--root", str(repo)),
        env=server_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "loopback" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1


def _post_initialize(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """A raw initialize request (what any local process could send): status, headers, body."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url,
        data=json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "probe", "version": "0"},
                },
            }
        ).encode(),
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **headers,
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read(4096)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_http_needs_the_token(http_server: tuple[str, Any]) -> None:
    """Without `Authorization: Bearer <token>`, or with a wrong one, nothing reaches a tool."""
    from hybrid.mcp import auth

    url, _ = http_server
    path = auth.token_path()
    assert path.stat().st_mode & 0o777 == 0o600
    token = path.read_text().strip()
    for headers in ({}, {"Authorization": "Bearer " + "A" * len(token)}, {"Authorization": token}):
        status, answered, text = _post_initialize(url, headers)
        assert status == 401, (headers, status, text)
        assert answered.get("www-authenticate", answered.get("WWW-Authenticate", "")).startswith(
            "Bearer"
        )
        assert "Authorization: Bearer" in json.loads(text)["message"]
    status, _, _ = _post_initialize(url, {"Authorization": f"Bearer {token}"})
    assert status == 200


def test_http_on_a_unix_socket_serves_its_user(repo: Path, tmp_path: Path) -> None:
    """--unix-socket: a 0600 socket, no token; the SDK client reaches it through the socket."""
    path = tmp_path / "mcp.sock"
    proc = subprocess.Popen(
        server_argv(
            "--transport", "http", "--unix-socket", str(path), "--root", str(repo), "--json"
        ),
        env=server_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        shown = json.loads(proc.stdout.readline())
        assert shown["unix_socket"] == str(path)
        assert path.stat().st_mode & 0o777 == 0o600

        async def session() -> None:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(path)))
            async with Client(streamable_http_client(shown["url"], http_client=http)) as client:
                mapped = body(await client.call_tool("repo_map", {"tokens": 256}))
                assert mapped["files_total"] == 3

        anyio.run(session)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_http_session_runs_python(http_server: tuple[str, Any]) -> None:
    url, _ = http_server

    async def session() -> None:
        async with http_client(url) as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS
            run = body(
                await client.call_tool(
                    "run_python", {"source": "x = 3", "tests": "assert x == 3\nassert x == 4\n"}
                )
            )
            assert [t["passed"] for t in run["tests"]] == [True, False]
            mapped = body(await client.call_tool("repo_map", {"tokens": 256}))
            assert mapped["files_total"] == 3

    anyio.run(session)


# -- workstations (the real engine) ---------------------------------------------------------


def _containers(name: str) -> list[Any]:
    from hybrid.workstation.docker import client

    found: list[Any] = client().api.containers(all=True, filters={"label": f"hybrid.name={name}"})
    return found


def _wait_gone(name: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while _containers(name):
        assert time.monotonic() < deadline, f"workstation {name} is still there"
        time.sleep(0.5)


@pytest.mark.engine
@pytest.mark.parametrize("mode", MODES)
def test_workstation_create_exec_write_diff_destroy(
    engine: Any, http_server: tuple[str, Any], mode: str
) -> None:
    url, _ = http_server
    logs: list[Any] = []

    async def on_log(params: Any) -> None:
        logs.append(params)

    async def session() -> None:
        async with http_client(url, mode=mode, logging_callback=on_log, log_level="info") as client:
            info = body(await client.call_tool("ws_create", {"repo": "."}))
            name = info["name"]
            assert info["tier"] == "docker" and not info["persistent"]
            try:
                ran = await client.call_tool(
                    "ws_exec",
                    {
                        "workstation": name,
                        "command": "python3 -c 'from pkg.shipping import cost; print(cost(2))'",
                    },
                )
                assert body(ran)["stdout"] == "9.0\n", body(ran)
                assert any(p.logger == "stdout" and "9.0" in p.data for p in logs), logs

                source = "def cost(weight: float) -> float:\n    return 6.0 + 2.0 * weight\n"
                written = body(
                    await client.call_tool(
                        "ws_write_file",
                        {"workstation": name, "path": "pkg/shipping.py", "content": source},
                    )
                )
                assert written["bytes"] == len(source)
                read = body(
                    await client.call_tool(
                        "ws_read_file", {"workstation": name, "path": "pkg/shipping.py"}
                    )
                )
                assert read["content"] == source and read["encoding"] == "utf-8"
                diff = body(await client.call_tool("ws_diff", {"workstation": name}))["diff"]
                assert "+    return 6.0 + 2.0 * weight" in diff and "pkg/shipping.py" in diff

                failed = body(
                    await client.call_tool("ws_exec", {"workstation": name, "command": "exit 3"})
                )
                assert failed["exit_code"] == 3 and failed["termination"] == "nonzero_exit"

                if mode == "legacy":
                    # Another session cannot reach this one's workstation.
                    async with http_client(url, mode=mode) as other:
                        hidden = error(await other.call_tool("ws_diff", {"workstation": name}))
                        assert hidden["type"] == "WorkstationNotFound"
            finally:
                gone = body(await client.call_tool("ws_destroy", {"workstation": name}))
            assert gone == {"removed": name}
            assert not _containers(name)
            again = error(await client.call_tool("ws_diff", {"workstation": name}))
            assert again["type"] == "WorkstationNotFound"

    anyio.run(session)


@pytest.mark.engine
def test_gate_and_snapshot(engine: Any, http_server: tuple[str, Any]) -> None:
    url, _ = http_server
    patch = (
        "--- a/pkg/shipping.py\n+++ b/pkg/shipping.py\n@@ -6 +6 @@\n"
        "-    return 5.0 + 2.0 * weight\n+    return 6.0 + 2.0 * weight\n"
    )
    test = "python3 -c 'from pkg.shipping import cost; assert cost(1) == 8.0'"

    async def session() -> None:
        async with http_client(url, mode="legacy") as client:
            ready = body(
                await client.call_tool("gate_patch", {"patch": patch, "repo": ".", "test": test})
            )
            assert ready["disposition"] == "ready for human review", ready
            blocked = body(
                await client.call_tool(
                    "gate_patch", {"patch": patch, "repo": ".", "test": "exit 1"}
                )
            )
            assert blocked["disposition"] == "blocked"
            # An empty patch is a verdict, as on the command line, not bad input.
            empty = body(
                await client.call_tool("gate_patch", {"patch": "", "repo": ".", "test": test})
            )
            assert empty["disposition"] == "blocked", empty
            outside = error(
                await client.call_tool("gate_patch", {"patch": patch, "repo": "/", "test": "true"})
            )
            assert outside["type"] == "PolicyViolation"

            made = body(await client.call_tool("ws_create", {"repo": "."}))["name"]
            await client.call_tool(
                "ws_write_file", {"workstation": made, "path": "note.txt", "content": "kept"}
            )
            snapshot = body(await client.call_tool("ws_snapshot", {"workstation": made}))
            started = body(await client.call_tool("ws_create", {"from_snapshot": snapshot["name"]}))
            read = body(
                await client.call_tool(
                    "ws_read_file", {"workstation": started["name"], "path": "note.txt"}
                )
            )
            assert read["content"] == "kept"
            names = [made, started["name"]]
        # The session ended (DELETE): its workstations and its snapshot go.
        for name in names:
            _wait_gone(name, 60)
        from hybrid.workstation import backend

        deadline = time.monotonic() + 60
        while any(s.name == snapshot["name"] for s in backend().snapshots()):
            assert time.monotonic() < deadline, "the session's snapshot is still there"
            time.sleep(0.5)

    anyio.run(session)


_CLIENT = """
import sys, anyio, json
from mcp import Client, StdioServerParameters
target = json.loads(sys.argv[1])
if isinstance(target, dict):
    target = StdioServerParameters(**target)
else:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from hybrid.mcp import auth
    headers = {auth.HEADER: "Bearer " + auth.token_path().read_text().strip()}
    target = streamable_http_client(target, http_client=create_mcp_http_client(headers=headers))

async def main():
    async with Client(target, mode=sys.argv[2]) as client:
        result = await client.call_tool("ws_create", {})
        print(json.loads(result.content[0].text)["name"], flush=True)
        await anyio.sleep(600)

anyio.run(main)
"""


def _killed_client(target: Any, mode: str) -> str:
    """Start a client that makes a workstation, SIGKILL it, return the workstation's name."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, json.dumps(target), mode],
        env=server_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own: the stdio server is in it too
    )
    try:
        assert proc.stdout is not None
        name = proc.stdout.readline().strip()
        assert name.startswith("mcp-"), name
        assert _containers(name)
    finally:
        proc.send_signal(signal.SIGKILL)  # the client only: its stdio server stays, sees EOF
        proc.wait()
    return name


@pytest.mark.engine
@pytest.mark.parametrize("mode", MODES)
def test_a_killed_stdio_client_leaves_no_workstation(engine: Any, repo: Path, mode: str) -> None:
    target = stdio("--root", str(repo)).model_dump(mode="json")
    name = _killed_client(target, mode)
    _wait_gone(name)
    # The server went with its client: no process of it is left in the client's group.
    deadline = time.monotonic() + 60
    while _server_pids(repo):
        assert time.monotonic() < deadline, "the stdio server outlived its client"
        time.sleep(0.5)


def _server_pids(repo: Path) -> list[int]:
    """The stdio servers serving ``repo`` (a path no other test uses)."""
    out = subprocess.run(
        ["pgrep", "-f", "--", f"hybrid mcp --root {repo}"], capture_output=True, text=True
    )
    return [int(pid) for pid in out.stdout.split()]


@pytest.mark.engine
@pytest.mark.parametrize("mode", MODES)
def test_a_killed_http_client_leaves_no_workstation(
    engine: Any, http_server: tuple[str, Any], mode: str
) -> None:
    url, proc = http_server
    name = _killed_client(url, mode)
    _wait_gone(name, 60)  # the server's idle time is 3 s
    assert proc.poll() is None  # the server itself stays up for other clients
