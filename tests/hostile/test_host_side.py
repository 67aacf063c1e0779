"""The hostile repository (hostile_repo.py) through every host-side entry point.

Each entry point is one test; each runs for real (the CLI as a ``python -m hybrid`` process with
its own state, the MCP tools through the official SDK client) and is then judged on every attack
class at once:

- exec: no planted command ran (git fsmonitor/hooks/filters/drivers/pager, a setup.py);
- secret: no host secret in stdout, stderr, an MCP result or log, a prompt the model endpoint
  received, or the state and caches the run wrote;
- net: the loopback listener the repository names received no connection;
- hang: the run finished within its timeout (a FIFO or /dev/zero read forever does not);
- escape: no raw terminal escape and no forged line in text output;
- procs: no process and no container of the run outlives it;
- error: no traceback, and a failure says why on stderr;
- named: where a walk of the repository skips a planted link, FIFO or device (map, context),
  the output names it, so a user knows why a file is missing.

The closing table (entry point x class) is written to ``$HYBRID_HOST_SIDE_REPORT`` (default:
host-side-report.md under the pytest basetemp).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hostile_repo import (
    DECL_FORMATS,
    ENV_SECRET_VAR,
    ESCAPE_NAME,
    FORGED,
    NEWLINE_NAME,
    TASK,
    Host,
    Parts,
    Recorder,
    build_repo,
    scan_for,
)

CHECKOUT = Path(__file__).resolve().parent.parent.parent
CLASSES = ("exec", "secret", "net", "hang", "escape", "procs", "error", "named")
RUN_VAR = "HYBRID_HOSTILE_RUN"
"""Each run's token in its environment: a process carrying it after the run is a leftover."""
RESULTS: dict[str, dict[str, str]] = {}
SAID: dict[str, list[str]] = {}


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Replaces the tier suite's per-case check (these cases take no tier): each run here checks
    its own leftovers."""
    yield


# -- the model endpoint ---------------------------------------------------------------------------


class ModelEndpoint:
    """An OpenAI-compatible chat endpoint on loopback that records every prompt and answers
    that it changes nothing."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        prompts = self.prompts

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                prompts.append(raw.decode("utf-8", "replace"))
                body = {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "local",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "No change is needed."},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }
                data = json.dumps(body).encode()
                with contextlib.suppress(OSError):
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorder() -> Iterator[Recorder]:
    made = Recorder()
    yield made
    made.close()


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, recorder: Recorder) -> Host:
    return Host(tmp_path_factory.mktemp("hostile-host"), recorder)


@pytest.fixture(scope="module")
def shared(host: Host) -> dict[str, Path]:
    """Repositories the read-only entry points share: a git checkout with every part, and a
    plain directory (git ignores FIFOs, so only a walk meets one there)."""
    return {
        "git": build_repo(host, host.base / "shared" / "repo"),
        "plain": build_repo(host, host.base / "shared-plain" / "repo", Parts(git=False)),
    }


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """This module's own state and runtime directories (the cache is the session's, so its
    dependency layers are pruned with it)."""
    base = tmp_path_factory.mktemp("hostile-hybrid")
    made = {name: base / name for name in ("state", "run")}
    for path in made.values():
        path.mkdir()
    made["cache"] = Path(os.environ["HYBRID_CACHE_DIR"])
    return made


@pytest.fixture(scope="module")
def model() -> Iterator[ModelEndpoint]:
    made = ModelEndpoint()
    yield made
    made.close()


# -- one run and its verdict ----------------------------------------------------------------------


@dataclass
class Verdict:
    """What one entry point did, by attack class."""

    name: str
    host: Host
    hostname: bool = False
    problems: dict[str, list[str]] = field(default_factory=lambda: {c: [] for c in CLASSES})
    texts: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    """What each run said on stderr (its last line), for the closing report."""

    def add(self, cls: str, problem: str) -> None:
        self.problems[cls].append(problem)

    def output(self, text: str, where: str, *, terminal: bool = True) -> None:
        """Judge one piece of output: secrets, and (for what a terminal shows) escapes."""
        self.texts.append(text)
        for leaked in self.host.leaked(text, hostname=self.hostname):
            self.add("secret", f"{where}: {leaked[:48]!r}")
        if terminal:
            if "\x1b" in text or "\x07" in text:
                self.add("escape", f"{where}: a raw terminal escape")
            if any(line.lstrip().startswith(FORGED) for line in text.splitlines()):
                self.add("escape", f"{where}: a forged line ({FORGED}...)")

    def error_text(self, stdout: str, stderr: str, code: int | None, where: str) -> None:
        if "Traceback (most recent call last)" in stderr:
            last = [line for line in (stderr or stdout).splitlines() if line.strip()][-1:]
            self.add("error", f"{where}: traceback ({last[0][:120] if last else ''})")
        elif code not in (0, None) and not stderr.strip() and not stdout.strip():
            # (exit 1 with a report on stdout is a verdict: unsolved, blocked)
            self.add("error", f"{where}: exit {code} with nothing said")
        elif code is not None and code < 0:
            self.add("error", f"{where}: killed by signal {-code}")

    def finish(self, before_hits: int, dirs: dict[str, Path], started: float) -> None:
        host = self.host
        for marker in host.markers():
            self.add("exec", f"ran: {marker}")
        for path in host.watch.iterdir():
            path.unlink()
        hits = host.recorder.hits[before_hits:]
        for peer, data in hits:
            self.add("net", f"connection from {peer}: {data[:60]!r}")
        needles = host.secrets()
        for root in (dirs["state"], dirs["cache"]):
            for found in scan_for(root, needles, since=started):
                self.add("secret", f"stored: {found}")
        cells = {
            c: ("ok" if not p else "FAIL: " + "; ".join(p)[:300]) for c, p in self.problems.items()
        }
        RESULTS[self.name] = cells
        SAID[self.name] = self.said

    def assert_contained(self) -> None:
        failed = {c: p for c, p in self.problems.items() if p}
        assert not failed, f"{self.name} not contained:\n" + "\n".join(
            f"  {c}: {line}" for c, lines in failed.items() for line in lines
        )


def _env(host: Host, dirs: dict[str, Path], token: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HYBRID_", "PYTEST_")) and k != "PYTHONPATH"
    }
    env.update(
        {
            "PYTHONPATH": str(CHECKOUT),
            "HYBRID_STATE_DIR": str(dirs["state"]),
            "HYBRID_CACHE_DIR": str(dirs["cache"]),
            "HYBRID_RUNTIME_DIR": str(dirs["run"]),
            "HYBRID_NO_SERVER": "1",
            ENV_SECRET_VAR: host.env_secret,
            RUN_VAR: token,
            "NO_COLOR": "1",
        }
    )
    for name in ("HYBRID_REQUIRE_ENGINE",):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _holders(token: str) -> list[int]:
    """Live processes whose environment carries ``token``."""
    found = []
    needle = f"{RUN_VAR}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            data = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in data and state != "Z":
            found.append(int(entry))
    return found


def _containers_of(pids: set[int]) -> list[str]:
    """Hybrid's containers (running or not) whose owner is one of ``pids`` on this host."""
    if not pids:
        return []
    try:
        out = subprocess.run(
            [
                "docker",
                "ps",
                "-a",
                "--filter",
                "label=hybrid.managed",
                "--format",
                '{{.ID}} {{.Label "hybrid.owner"}}',
            ],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    me = socket.gethostname()
    found = []
    for line in out.splitlines():
        cid, _, owner = line.partition(" ")
        parts = owner.split(":")
        if len(parts) >= 2 and parts[0] == me and parts[1].isdigit() and int(parts[1]) in pids:
            found.append(cid)
    return found


def _leftovers(verdict: Verdict, token: str, pids: set[int]) -> None:
    deadline = time.monotonic() + 5
    while True:
        alive = _holders(token)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid in alive:
        cmd = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
            if Path(f"/proc/{pid}/cmdline").exists()
            else b"?"
        )
        verdict.add("procs", f"process {pid} left: {cmd.decode(errors='replace')}")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    containers = _containers_of(pids | set(alive))
    for cid in containers:
        verdict.add("procs", f"container {cid} left")
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, timeout=60)


class Runner:
    """Runs hybrid for one entry point and fills its verdict."""

    def __init__(
        self,
        name: str,
        host: Host,
        dirs: dict[str, Path],
        hostname: bool = False,
        shared_cache: bool = False,
    ):
        self.verdict = Verdict(name, host, hostname=hostname)
        self.host = host
        # A cache of its own, so what one entry point stored is not blamed on the next; the
        # engine's entry points share the session's (its dependency layers are pruned with it).
        self.dirs = dict(dirs)
        if not shared_cache:
            self.dirs["cache"] = Path(tempfile.mkdtemp(prefix="cache-", dir=dirs["state"].parent))
        self.started = time.time()
        self.token = secrets.token_hex(8)
        self.pids: set[int] = set()
        self.before_hits = len(host.recorder.hits)
        for path in host.watch.iterdir():  # a previous failed case's markers are its own
            path.unlink()

    @property
    def env(self) -> dict[str, str]:
        return _env(self.host, self.dirs, self.token)

    def cli(
        self, *args: str, timeout: float = 60, cwd: Path | None = None, terminal: bool = True
    ) -> tuple[int | None, str, str]:
        """``python -m hybrid ARGS`` in its own session, killed (and judged hung) at ``timeout``."""
        where = "hybrid " + " ".join(a if len(a) < 40 else a[:37] + "..." for a in args[:3])
        proc = subprocess.Popen(
            [sys.executable, "-m", "hybrid", *args],
            env=self.env,
            cwd=cwd or CHECKOUT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.pids.add(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            code = None
            self.verdict.add("hang", f"{where}: still running after {timeout:g} s")
        stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        self.verdict.output(stdout, f"{where} stdout", terminal=terminal)
        self.verdict.output(stderr, f"{where} stderr")
        self.verdict.error_text(stdout, stderr, code, where)
        last = [line for line in (stderr or stdout).splitlines() if line.strip()][-1:]
        self.verdict.said.append(f"{where} -> exit {code}: {last[0][:200] if last else ''}")
        return code, stdout, stderr

    def expect_named(self, said: str, repo: Path, where: str) -> None:
        """Every planted entry a walk of ``repo`` skips is named in ``said``: in its ``skipped``
        list (JSON), else on a line that says it skipped it (text)."""
        try:
            data = json.loads(said)
            notes = "\n".join(data.get("skipped") or []) if isinstance(data, dict) else ""
        except ValueError:
            notes = "\n".join(line for line in said.splitlines() if "skip" in line.lower())
        for rel in skipped_entries(repo):
            if rel not in notes:
                self.verdict.add("named", f"{where}: {rel} skipped without a word")

    def done(self, *, prompts: list[str] | None = None) -> Verdict:
        for n, prompt in enumerate(prompts or []):
            self.verdict.output(prompt, f"prompt {n}", terminal=False)
        _leftovers(self.verdict, self.token, self.pids)
        self.verdict.finish(self.before_hits, self.dirs, self.started)
        return self.verdict


# -- read-only entry points on the shared repositories -------------------------------------------

HOSTILE_FILES = (
    "app/tracked_secret.py",
    "app/environ_tracked.py",
    "app/shadow_tracked.py",
    "app/untracked_secret.py",
    "app/environ.py",
    "app/shadow.py",
    "libs/inner/helpers.py",
    "app/zero.py",
    "app/fifo.py",
    f"app/{ESCAPE_NAME}",
    f"app/{NEWLINE_NAME}",
)
"""Every planted file, by the name a user (or an agent) would give."""


def skipped_entries(repo: Path) -> list[str]:
    """The planted links, FIFO and device a walk of ``repo`` meets (git lists no FIFO or
    device, so a checkout's walk meets only the links; ``libs`` is the replaced directory)."""
    names = [
        "app/tracked_secret.py",
        "app/environ_tracked.py",
        "app/shadow_tracked.py",
        "app/untracked_secret.py",
        "app/environ.py",
        "app/shadow.py",
        "libs",
    ]
    if not (repo / ".git").exists():
        names += ["app/fifo.py", "app/zero.py"]
    return names


def test_map(host: Host, shared: dict[str, Path], dirs: dict[str, Path]) -> None:
    run = Runner("map", host, dirs)
    for repo in shared.values():
        _, out, err = run.cli("map", str(repo), "--task", TASK, "--tokens", "60000", timeout=30)
        run.expect_named(out + err, repo, "map")
        run.cli(
            "map",
            str(repo),
            "--task",
            TASK,
            "--tokens",
            "60000",
            "--json",
            timeout=30,
            terminal=False,
        )
    run.done().assert_contained()


def test_context(host: Host, shared: dict[str, Path], dirs: dict[str, Path]) -> None:
    run = Runner("context", host, dirs)
    for repo in shared.values():
        _, out, err = run.cli(
            "context", "pack", str(repo), "--task", TASK, "--tokens", "60000", timeout=30
        )
        run.expect_named(out + err, repo, "context")
    run.done().assert_contained()


def test_skeleton(host: Host, shared: dict[str, Path], dirs: dict[str, Path]) -> None:
    run = Runner("skeleton", host, dirs)
    for repo in shared.values():
        for rel in HOSTILE_FILES:
            run.cli("skeleton", str(repo / rel), timeout=20)
    run.done().assert_contained()


def test_check_grep(host: Host, shared: dict[str, Path], dirs: dict[str, Path]) -> None:
    run = Runner("check grep", host, dirs)
    pattern = "SECRET|root:|daemon:|API_TOKEN|HYBRID"
    for repo in shared.values():
        run.cli("check", "grep", pattern, str(repo), timeout=30)
        run.cli("check", "grep", "-i", pattern, str(repo / "app"), timeout=30)
    run.done().assert_contained()


# -- the MCP server, through the official SDK client ----------------------------------------------

MCP_TOOLS = (
    "repo_map",
    "context_pack",
    "skeleton",
    "run_check",
    "ws_create",
    "gate_patch",
    "solve",
)
"""Every MCP tool that takes a host repository or path (the ws_* tools after ws_create take a
workstation name and a path inside it)."""
ENGINE_TOOLS = {"ws_create", "gate_patch", "solve"}
PATCH = (
    "--- a/app/shipping.py\n+++ b/app/shipping.py\n@@ -1,3 +1,4 @@\n"
    ' """Shipping costs."""\n+# reviewed\n \n \n'
)


def _mcp_calls(tool: str, git: Path, plain: Path) -> list[tuple[str, dict[str, Any]]]:
    """The calls one tool gets: every hostile file and both repositories."""
    if tool == "repo_map":
        return [("repo_map", {"root": str(r), "task": TASK, "tokens": 60000}) for r in (git, plain)]
    if tool == "context_pack":
        return [
            ("context_pack", {"root": str(r), "task": TASK, "tokens": 60000}) for r in (git, plain)
        ]
    if tool == "skeleton":
        return [("skeleton", {"path": str(r / rel)}) for r in (git, plain) for rel in HOSTILE_FILES]
    if tool == "run_check":
        calls: list[tuple[str, dict[str, Any]]] = []
        for r in (git, plain):
            calls.append(
                (
                    "run_check",
                    {"check": "grep", "pattern": "SECRET|root:|API_TOKEN", "path": str(r)},
                )
            )
            for rel in HOSTILE_FILES[:9]:
                calls.append(("run_check", {"check": "redact", "path": str(r / rel)}))
                calls.append(("run_check", {"check": "csv", "path": str(r / rel)}))
        return calls
    if tool == "ws_create":
        return [("ws_create", {"repo": str(git)})]
    if tool == "gate_patch":
        return [
            (
                "gate_patch",
                {
                    "patch": PATCH,
                    "repo": str(git),
                    "test": "python3 -m pytest -q tests/test_shipping.py",
                },
            )
        ]
    if tool == "solve":
        return [
            (
                "solve",
                {"task": TASK, "repo": str(git), "test": "python3 -m pytest -q", "steps": 1},
            )
        ]
    raise AssertionError(tool)


@pytest.mark.parametrize("tool", MCP_TOOLS)
def test_mcp(
    tool: str,
    host: Host,
    shared: dict[str, Path],
    dirs: dict[str, Path],
    model: ModelEndpoint,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    import anyio
    from mcp import Client, StdioServerParameters

    if tool in ENGINE_TOOLS:
        request.getfixturevalue("engine")
    # Tools that write (workstations, the gate's baseline, solve) get their own copy.
    if tool in ENGINE_TOOLS:
        git = build_repo(host, tmp_path / "git" / "repo")
        plain = build_repo(host, tmp_path / "plain" / "repo", Parts(git=False))
    else:
        git, plain = shared["git"], shared["plain"]
    run = Runner(f"mcp {tool}", host, dirs, shared_cache=tool in ENGINE_TOOLS)
    prompts_before = len(model.prompts)
    args = ["-m", "hybrid", "mcp", "--root", str(git), "--root", str(plain)]
    if tool == "solve":
        args += ["--model", "local", "--base-url", model.url, "--api-key-env", ""]
    server = StdioServerParameters(
        command=sys.executable, args=args, env=run.env, cwd=str(CHECKOUT)
    )
    logs: list[str] = []
    timeout = 300 if tool in ENGINE_TOOLS else 45

    async def on_log(params: Any) -> None:
        logs.append(str(params.data))

    async def session() -> None:
        async with Client(server, logging_callback=on_log, log_level="info") as client:
            run.pids.update(_holders(run.token))
            for name, arguments in _mcp_calls(tool, git, plain):
                where = f"mcp {name}({', '.join(f'{k}={str(v)[-30:]!r}' for k, v in arguments.items() if k != 'patch')})"
                try:
                    with anyio.fail_after(timeout):
                        result = await client.call_tool(name, arguments)
                except TimeoutError:
                    run.verdict.add("hang", f"{where}: no answer after {timeout} s")
                    return  # the server is stuck: the session ends here
                text = "\n".join(getattr(c, "text", "") for c in result.content)
                run.verdict.output(text, where, terminal=False)
                if name in ("repo_map", "context_pack"):
                    run.expect_named(text, Path(arguments["root"]), where)
                if result.is_error and "Traceback" in text:
                    run.verdict.add("error", f"{where}: traceback in the error")
                if name == "ws_create" and not result.is_error:
                    ws = json.loads(text)["name"]
                    # What the copy-in carried into the sandbox: a host secret there is a leak.
                    probe = await client.call_tool(
                        "ws_exec",
                        {
                            "workstation": ws,
                            "command": "grep -r -a -h -o -E '[A-Z]+SECRET-[0-9a-f]{12}' . ; true",
                        },
                    )
                    run.verdict.output(
                        "\n".join(getattr(c, "text", "") for c in probe.content),
                        "ws_exec grep in the workstation",
                        terminal=False,
                    )
                    await client.call_tool("ws_destroy", {"workstation": ws})

    try:
        anyio.run(session)
    except Exception as exc:  # a crash of the client session is the server's failure
        run.verdict.add("error", f"session: {type(exc).__name__}: {str(exc)[:200]}")
    for line in logs:
        run.verdict.output(line, "mcp log", terminal=False)
    run.done(prompts=model.prompts[prompts_before:]).assert_contained()


# -- dependencies ----------------------------------------------------------------------------------


def _decl_repo(host: Host, tmp_path: Path, fmt: str) -> Path:
    return build_repo(
        host,
        tmp_path / fmt / "repo",
        Parts(git=True, links=False, special=False, names=False, decls=fmt),
    )


@pytest.mark.parametrize("fmt", DECL_FORMATS)
def test_deps_show(fmt: str, host: Host, dirs: dict[str, Path], tmp_path: Path) -> None:
    repo = _decl_repo(host, tmp_path, fmt)
    run = Runner(f"deps show [{fmt}]", host, dirs, hostname=True)
    run.cli("deps", "show", str(repo), timeout=60)
    run.cli("deps", "show", str(repo), "--json", timeout=60, terminal=False)
    run.done().assert_contained()


@pytest.mark.parametrize("fmt", DECL_FORMATS)
def test_deps_lock(fmt: str, host: Host, dirs: dict[str, Path], tmp_path: Path) -> None:
    repo = _decl_repo(host, tmp_path, fmt)
    run = Runner(f"deps lock [{fmt}]", host, dirs, hostname=True)
    run.cli("deps", "lock", str(repo), "--refresh", timeout=300)
    run.done().assert_contained()


def test_deps_lock_approved(host: Host, dirs: dict[str, Path], tmp_path: Path) -> None:
    """An approved manifest that admits nothing must not let resolution run anything first."""
    repo = _decl_repo(host, tmp_path, "pyproject")
    approved = tmp_path / "approved.json"
    approved.write_text('{"artifacts": []}')
    run = Runner("deps lock --approved [pyproject]", host, dirs, hostname=True)
    run.cli("deps", "lock", str(repo), "--refresh", "--approved", str(approved), timeout=300)
    run.done().assert_contained()


@pytest.mark.parametrize("fmt", ["pyproject", "npm"])
def test_ws_up_deps(
    fmt: str, host: Host, dirs: dict[str, Path], tmp_path: Path, engine: Any
) -> None:
    repo = build_repo(host, tmp_path / fmt / "repo", Parts(decls=fmt))
    run = Runner(f"ws up --deps [{fmt}]", host, dirs, shared_cache=True)
    name = f"hostile-{secrets.token_hex(3)}"
    try:
        run.cli("ws", "up", name, "--repo", str(repo), "--deps", timeout=400)
    finally:
        # A workstation `ws up` made stays by design: take it down before judging leftovers.
        subprocess.run(
            [sys.executable, "-m", "hybrid", "ws", "down", name],
            env=run.env,
            cwd=CHECKOUT,
            capture_output=True,
            timeout=120,
        )
    run.done().assert_contained()


def test_ws_bwrap_copy(
    host: Host, dirs: dict[str, Path], tmp_path: Path, bwrap_backend: Any
) -> None:
    """A bwrap workspace lives on the host with the repository's links carried as they are:
    copying out and diffing must not follow them."""
    repo = build_repo(host, tmp_path / "repo", Parts(decls=None, special=False))
    run = Runner("ws up/cp/diff [bwrap]", host, dirs)
    name = f"hostile-{secrets.token_hex(3)}"
    try:
        run.cli("ws", "up", name, "--tier", "bwrap", "--repo", str(repo), timeout=120)
        for rel in HOSTILE_FILES[:7]:
            out = tmp_path / "out"
            run.cli("ws", "cp", f"{name}:{rel}", str(out), timeout=60)
            if out.is_file():
                run.verdict.output(out.read_text(errors="replace"), f"ws cp {rel}")
                out.unlink()
        run.cli("ws", "diff", name, timeout=60)
    finally:
        subprocess.run(
            [sys.executable, "-m", "hybrid", "ws", "down", name],
            env=run.env,
            cwd=CHECKOUT,
            capture_output=True,
            timeout=120,
        )
    run.done().assert_contained()


def test_validate(host: Host, dirs: dict[str, Path], tmp_path: Path, engine: Any) -> None:
    repo = build_repo(host, tmp_path / "repo", Parts(decls="pyproject"))
    run = Runner("validate", host, dirs, shared_cache=True)
    run.cli("validate", str(repo), "HEAD", "--timeout", "60", timeout=500)
    # Without dependencies it goes on: the parent and the fix written into a workstation.
    run.cli("validate", str(repo), "HEAD", "--no-deps", "--timeout", "60", timeout=500)
    run.done().assert_contained()


# -- the gate, the loop, evaluation ----------------------------------------------------------------


def test_gate(host: Host, dirs: dict[str, Path], tmp_path: Path, engine: Any) -> None:
    repo = build_repo(host, tmp_path / "repo")
    patch = tmp_path / "change.diff"
    patch.write_text(PATCH)
    run = Runner("gate", host, dirs, shared_cache=True)
    test = "python3 -m pytest -q tests/test_shipping.py"
    # With the repository's dependencies (refused), then without: the tests run in a workstation.
    for deps in ("--deps", "--no-deps"):
        run.cli("gate", str(patch), "--repo", str(repo), "--test", test, deps, "-q", timeout=400)
    run.done().assert_contained()


def test_solve_repo(
    host: Host, dirs: dict[str, Path], tmp_path: Path, model: ModelEndpoint, engine: Any
) -> None:
    repo = build_repo(host, tmp_path / "repo")
    run = Runner("solve --repo", host, dirs, shared_cache=True)
    before = len(model.prompts)
    run.cli(
        "solve",
        "--repo",
        str(repo),
        "--task",
        TASK,
        "--test",
        "python3 -m pytest -q",
        "--model",
        "local",
        "--base-url",
        model.url,
        "--api-key-env",
        "",
        "--steps",
        "1",
        "--context-tokens",
        "60000",
        "--bundle",
        str(tmp_path / "bundle"),
        "-q",
        timeout=400,
    )
    prompts = model.prompts[before:]
    # The bundle is evidence a reviewer reads: no host secret in it either.
    for found in scan_for(tmp_path / "bundle", host.secrets()):
        run.verdict.add("secret", f"bundle: {found}")
    verdict = run.done(prompts=prompts)
    assert prompts, "the model endpoint received no prompt: the entry point was not exercised"
    verdict.assert_contained()


def test_context_eval(host: Host, dirs: dict[str, Path], tmp_path: Path) -> None:
    repo = build_repo(host, tmp_path / "repo")
    run = Runner("context eval", host, dirs)
    run.cli("context", "eval", str(repo), "--limit", "5", timeout=120)
    run.done().assert_contained()


# -- the closing table ----------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if not RESULTS:
        return
    lines = [
        "| entry point | " + " | ".join(CLASSES) + " |",
        "|---|" + "---|" * len(CLASSES),
    ]
    for name, cells in RESULTS.items():
        lines.append(
            f"| {name} | "
            + " | ".join("ok" if cells[c] == "ok" else "FAIL" for c in CLASSES)
            + " |"
        )
    details = [
        f"- {name} / {c}: {v[6:]}"
        for name, cells in RESULTS.items()
        for c, v in cells.items()
        if v != "ok"
    ]
    text = "\n".join(lines) + "\n\n" + "\n".join(details) + "\n"
    target = os.environ.get("HYBRID_HOST_SIDE_REPORT")
    basetemp = request.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    path = Path(target) if target else basetemp / "host-side-report.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    json_path = path.with_suffix(".json")
    json_path.write_text(json.dumps(RESULTS, indent=2))
    path.with_suffix(".said.json").write_text(json.dumps(SAID, indent=2))
