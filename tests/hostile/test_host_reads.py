"""Host-side reads of a hostile repository: the context machinery never leaves it, never hangs.

A hostile checkout holds links out of it (untracked ``src/shadow.py -> <host secret>``,
``settings.py -> /proc/self/environ``, a link to /etc/shadow, a tracked link, a tracked ``pkg/``
replaced by ``pkg -> <host dir>``, and one hidden from ``git status`` by skip-worktree), a FIFO
and a device named like sources, and names carrying terminal escapes and newlines. Each entry
point that reads a repository on the host runs on it for real (`map`, `context`, `skeleton`,
`check grep` as CLI processes; `repo_map`, `context_pack`, `skeleton` over the MCP SDK's own
client; `solve --repo` against a local model endpoint that records its prompts). After each: no
host secret (a marker in files outside the repository, in the process environment) in any
output or prompt, every skipped file named with its reason, nothing hung, no process left.

These are host-side cases, not per tier: ``nothing_left_behind`` is overridden here so the
suite's tier parametrization does not apply.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from hostile_kit import ROOT, _descendants, git

pytestmark = pytest.mark.timeout(600)

HUNG = 120.0
"""Seconds a CLI run may take before the case calls it hung (a cold tree-sitter start is ~3 s)."""


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Host-side cases: no process this case started outlives it (the suite's per-tier check
    needs a sandbox, which these cases do not have)."""
    before = {pid for pid, _ in _descendants(os.getpid())}
    yield
    left = [(pid, name) for pid, name in _descendants(os.getpid()) if pid not in before]
    assert not left, f"processes left behind: {left}"


@dataclass
class Hostile:
    """A hostile checkout and what must never leak out of the host into an output."""

    repo: Path
    markers: list[str]
    env: dict[str, str]
    skipped: dict[str, str]
    """path in the repository -> a word its skip reason must hold."""
    shadow_lines: list[str]


def _marker(what: str) -> str:
    return f"H1-{what}-{secrets.token_hex(6)}"


def _host_secrets(tmp_path: Path) -> tuple[Path, list[str], dict[str, str], list[str]]:
    """Files outside any repository, and the environment, each holding a marker."""
    host = tmp_path / "host"
    markers = {k: _marker(k) for k in ("FILE", "DIR", "HIDDEN", "ENV")}
    (host / "secretdir").mkdir(parents=True)
    (host / "hidden").mkdir()
    (host / "secret.py").write_text(f'def leak_secret():\n    return "{markers["FILE"]}"\n')
    (host / "secretdir" / "a.py").write_text(f'def outside_fn():\n    return "{markers["DIR"]}"\n')
    (host / "hidden" / "b.py").write_text(f'def hidden_fn():\n    return "{markers["HIDDEN"]}"\n')
    env = {**os.environ, "H1_HOST_TOKEN": markers["ENV"]}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    shadow: list[str] = []
    with contextlib.suppress(OSError):  # readable as root: none of its lines may show up
        shadow = [ln for ln in Path("/etc/shadow").read_text().splitlines() if ln.strip()]
    return host, list(markers.values()), env, shadow


@pytest.fixture
def hostile(tmp_path: Path) -> Hostile:
    """A git checkout with every kind of link out of it (see the module docstring)."""
    host, markers, env, shadow = _host_secrets(tmp_path / "for-repo")
    repo = tmp_path / "repo"
    for rel, text in {
        "src/main.py": "def main():\n    return 0\n",
        "pkg/a.py": "def a_fn():\n    return 1\n",
        "lib/b.py": "def b_fn():\n    return 2\n",
    }.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    (repo / "tracked_env.py").symlink_to("/proc/self/environ")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    # A tracked directory replaced by a link out of the repository (git status: pkg/a.py deleted).
    os.remove(repo / "pkg" / "a.py")
    (repo / "pkg").rmdir()
    (repo / "pkg").symlink_to(host / "secretdir")
    # The same, hidden from git status: its index still says lib/b.py is there, unchanged.
    git(repo, "update-index", "--skip-worktree", "lib/b.py")
    os.remove(repo / "lib" / "b.py")
    (repo / "lib").rmdir()
    (repo / "lib").symlink_to(host / "hidden")
    # Untracked links to host files.
    (repo / "src" / "shadow.py").symlink_to(host / "secret.py")
    (repo / "settings.py").symlink_to("/proc/self/environ")
    (repo / "etc_shadow.py").symlink_to("/etc/shadow")
    skipped = {
        "pkg/a.py": "symlink",
        "lib/b.py": "symlink",
        "src/shadow.py": "symlink",
        "settings.py": "symlink",
        "etc_shadow.py": "symlink",
        "tracked_env.py": "symlink",
    }
    return Hostile(repo, markers, env, skipped, shadow)


@pytest.fixture
def plain(tmp_path: Path) -> Hostile:
    """A directory that is not a git repository: a FIFO, a device and a link named like sources."""
    host, markers, env, shadow = _host_secrets(tmp_path / "for-plain")
    root = tmp_path / "plain"
    root.mkdir()
    (root / "ok.py").write_text("def ok_fn():\n    return 3\n")
    os.mkfifo(root / "x.py")
    (root / "shadow.py").symlink_to(host / "secret.py")
    (root / "env.py").symlink_to("/proc/self/environ")
    (root / "linked").symlink_to(host / "secretdir")
    skipped = {"x.py": "FIFO", "shadow.py": "symlink", "env.py": "symlink", "linked": "symlink"}
    try:  # /dev/null's numbers: harmless if read, yet no source to index
        os.mknod(root / "null.py", stat.S_IFCHR | 0o644, os.makedev(1, 3))
        skipped["null.py"] = "device"
    except PermissionError:
        pass  # not root: the FIFO still covers a file that is no regular file
    return Hostile(root, markers, env, skipped, shadow)


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`hybrid ARGS` as its own process (so /proc/self/environ is its real environment); a run
    that does not finish within ``HUNG`` seconds fails the case instead of hanging the suite."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "hybrid", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=HUNG,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hybrid {' '.join(args)} hung (no answer in {HUNG:g} s)")


def assert_no_secret(hostile: Hostile, text: str, where: str) -> None:
    for marker in hostile.markers:
        assert marker not in text, f"{where}: host secret {marker} leaked"
    for line in hostile.shadow_lines:
        assert line not in text, f"{where}: a line of /etc/shadow leaked"


def assert_named(hostile: Hostile, skipped: list[str], where: str) -> None:
    """Every skipped file is listed as 'path: reason', the reason saying what it is."""
    by_path = {entry.split(": ", 1)[0]: entry for entry in skipped}
    for path, word in hostile.skipped.items():
        assert path in by_path, f"{where}: {path} is not named as skipped: {skipped}"
        assert word in by_path[path], f"{where}: {by_path[path]!r} does not say {word}"


TASK = "leak_secret outside_fn hidden_fn a_fn b_fn main settings shadow environ"


@pytest.mark.parametrize("command", ["map", "context"])
def test_links_out_of_a_checkout_are_never_read(hostile: Hostile, command: str) -> None:
    """`map`/`context` (text and --json) on a checkout whose links lead to host secrets."""
    args = [command, str(hostile.repo), "--task", TASK]
    text = run_cli(hostile.env, *args)
    assert text.returncode == 0, text.stderr
    assert_no_secret(hostile, text.stdout + text.stderr, f"{command} (text)")
    for path, word in hostile.skipped.items():
        assert f"# skipped {path}: " in text.stderr and word in text.stderr, text.stderr
    made = run_cli(hostile.env, *args, "--json")
    assert made.returncode == 0, made.stderr
    assert_no_secret(hostile, made.stdout + made.stderr, f"{command} --json")
    assert_named(hostile, json.loads(made.stdout)["skipped"], f"{command} --json")
    assert "main" in made.stdout  # the repository's own files are still there


@pytest.mark.parametrize("command", ["map", "context"])
def test_fifo_device_and_links_in_a_plain_directory(plain: Hostile, command: str) -> None:
    """Not a git repository: a FIFO named x.py must not hang it; a device is not read either."""
    made = run_cli(plain.env, command, str(plain.repo), "--task", "ok_fn leak_secret", "--json")
    assert made.returncode == 0, made.stderr
    assert_no_secret(plain, made.stdout + made.stderr, command)
    assert_named(plain, json.loads(made.stdout)["skipped"], command)
    assert "ok.py" in made.stdout


def test_skeleton_reads_no_fifo_device_or_link(plain: Hostile) -> None:
    """`hybrid skeleton` on a FIFO, a device, a link named like a source and a file under a
    linked directory: one line each, no hang, nothing read."""
    cases = [("x.py", "FIFO"), ("shadow.py", "symlink"), ("null.py", "device")]
    for name, word in [*cases, ("linked/a.py", "symlink")]:
        if name not in plain.skipped and "/" not in name:
            continue
        made = run_cli(plain.env, "skeleton", str(plain.repo / name))
        assert made.returncode == 2, (name, made.stdout, made.stderr)
        assert word in made.stderr and "Traceback" not in made.stderr, made.stderr
        assert_no_secret(plain, made.stdout + made.stderr, f"skeleton {name}")
    assert "def ok_fn" in run_cli(plain.env, "skeleton", str(plain.repo / "ok.py")).stdout


# -- names with terminal escapes and newlines ------------------------------------------------------

ESCAPE = "evil\x1b]0;pwned\x07.py"
FORGED = "forge\nfake.py:\n      1: def forged.py"


@pytest.fixture
def odd_names(tmp_path: Path) -> Path:
    repo = tmp_path / "names"
    repo.mkdir()
    (repo / ESCAPE).write_text("def escape_fn():\n    return 1\n")
    (repo / FORGED).write_text("def forged_fn():\n    return 2\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "names")
    return repo


@pytest.mark.parametrize(
    "args",
    [
        ["map", "{repo}", "--task", "escape_fn forged_fn"],
        ["context", "{repo}", "--task", "escape_fn forged_fn"],
        ["skeleton", "{repo}/" + ESCAPE, "{repo}/" + FORGED],
        ["check", "grep", "def", "{repo}"],
    ],
    ids=["map", "context", "skeleton", "grep"],
)
def test_names_cannot_send_escapes_or_forge_lines(odd_names: Path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    made = run_cli(env, *[a.replace("{repo}", str(odd_names)) for a in args])
    assert made.returncode in (0, 1), made.stderr
    shown = made.stdout + made.stderr
    assert "\x1b" not in shown and "\x07" not in shown, shown
    assert "evil\\x1b]0;pwned\\x07.py" in shown  # named, escaped
    lines = shown.splitlines()
    assert not any(ln.startswith("fake.py") for ln in lines), shown
    assert not any(ln.lstrip().startswith("1: def forged.py") for ln in lines), shown
    if args[0] in ("map", "context"):  # JSON keeps the real names (json escapes them)
        made = run_cli(env, *[a.replace("{repo}", str(odd_names)) for a in args], "--json")
        data = json.loads(made.stdout)
        names = {e["path"] for e in data["entries"]} if "entries" in data else set(data["ranking"])
        assert {ESCAPE, FORGED} <= names, names


# -- the MCP server --------------------------------------------------------------------------------


def _mcp_calls(
    env: dict[str, str], roots: list[Path], calls: list[tuple[str, dict[str, Any]]]
) -> list[tuple[bool, str]]:
    """Each call's (is_error, text) from a stdio `hybrid mcp` server driven by the SDK's client;
    the whole session must end within ``HUNG`` seconds (a hung tool fails the case)."""
    from mcp import Client, StdioServerParameters

    args = ["-m", "hybrid", "mcp", *[a for r in roots for a in ("--root", str(r))]]
    server = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(ROOT))
    results: list[tuple[bool, str]] = []
    hung: list[tuple[str, dict[str, Any]]] = []

    async def session() -> None:
        async with Client(server) as client:
            for tool, arguments in calls:
                try:
                    with anyio.fail_after(HUNG):
                        result = await client.call_tool(tool, arguments)
                except TimeoutError:
                    hung.append((tool, arguments))
                    return  # leaving the client stops the server
                text = "".join(c.text for c in result.content if c.type == "text")
                results.append((bool(result.is_error), text))

    anyio.run(session)
    if hung:
        pytest.fail(f"an MCP tool hung (no answer in {HUNG:g} s): {hung[0]}")
    return results


def test_mcp_tools_never_read_links_fifos_or_devices(hostile: Hostile, plain: Hostile) -> None:
    env = hostile.env
    plain.markers = hostile.markers + plain.markers
    (pack_error, pack), (map_error, mapped), (fifo_map_error, fifo_map), *skeletons = _mcp_calls(
        env,
        [hostile.repo, plain.repo],
        [
            ("context_pack", {"root": str(hostile.repo), "task": TASK, "tokens": 8000}),
            ("repo_map", {"root": str(hostile.repo), "task": TASK}),
            ("repo_map", {"root": str(plain.repo), "task": "ok_fn"}),
            ("skeleton", {"path": str(plain.repo / "x.py")}),
            ("skeleton", {"path": str(hostile.repo / "src" / "shadow.py")}),
        ],
    )
    assert not pack_error and not map_error and not fifo_map_error, (pack, mapped, fifo_map)
    for text in (pack, mapped, fifo_map, *[t for _, t in skeletons]):
        assert_no_secret(plain, text, "mcp")
    assert_named(hostile, json.loads(pack)["skipped"], "context_pack")
    assert_named(hostile, json.loads(mapped)["skipped"], "repo_map")
    assert_named(plain, json.loads(fifo_map)["skipped"], "repo_map (plain)")
    assert all(error for error, _ in skeletons), skeletons


# -- the prompt `solve --repo` sends -----------------------------------------------------------------


class PromptRecorder:
    """A chat-completions endpoint on 127.0.0.1 that records every request and answers 'no'."""

    def __init__(self) -> None:
        self.bodies: list[str] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                recorder.bodies.append(raw.decode("utf-8", "replace"))
                answer = {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "recorder",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "no change"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.engine
def test_solve_repo_prompt_holds_no_host_secret(engine, hostile: Hostile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`hybrid solve --repo` on the hostile checkout: the model endpoint never sees a host secret."""
    recorder = PromptRecorder()
    try:
        made = run_cli(
            hostile.env,
            "solve",
            "--repo",
            str(hostile.repo),
            "--test",
            "true",
            "--task",
            TASK,
            "--model",
            "recorder",
            "--base-url",
            recorder.url,
            "--api-key-env",
            "",
            "--steps",
            "1",
            "--quiet",
            "--bundle",
            str(tmp_path / "bundle"),
        )
    finally:
        recorder.close()
    assert recorder.bodies, f"the model was never asked: {made.stderr[-2000:]}"
    for body in recorder.bodies:
        assert_no_secret(hostile, json.loads(body)["messages"][1]["content"], "solve prompt")
        assert_no_secret(hostile, body, "solve request")
    assert "def main" in recorder.bodies[0]  # the repository's own file reached the prompt
    assert_no_secret(hostile, made.stdout + made.stderr, "solve output")
