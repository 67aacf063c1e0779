"""Every forwarded command gives the same exit code, stdout and stderr through the server as in
a process of its own: relative paths, stdin, bad input, --json, tests, repo maps."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_kit import CLIENT, Server, gone, normal, wait_for

REPO = {
    "pkg/__init__.py": "",
    "pkg/rates.py": (
        '"""Rates."""\n\nimport csv\n\n\ndef load_rates(path):\n    """Read a rate card."""\n'
        "    with open(path) as f:\n        return list(csv.DictReader(f))\n\n\n"
        "class Card:\n    def total(self, rows):\n        return sum(float(r['rate']) for r in rows)\n"
    ),
    "pkg/cli.py": "from pkg.rates import load_rates, Card\n\n\ndef main():\n    print(Card().total(load_rates('r.csv')))\n",
    "rate_card.csv": "role,rate\nengineer,100\ndesigner,80\n",
    "bad.csv": "role,rate\nengineer,100,extra\n",
    "data.json": '{"name": "x", "n": 3}\n',
    "snippet.py": "import csv\nrows = list(csv.DictReader(open('rate_card.csv')))\nprint(len(rows))\n",
    "snippet_test.py": "assert len(rows) == 2\ndef test_first():\n    assert rows[0]['role'] == 'engineer'\n",
    "failing_test.py": "def test_wrong():\n    assert rows == []\n",
}

CASES: list[tuple[str, list[str], bytes]] = [
    ("csv-relative", ["check", "csv", "rate_card.csv"], b""),
    ("csv-json", ["check", "csv", "rate_card.csv", "--json"], b""),
    ("csv-bad-rows", ["check", "csv", "bad.csv"], b""),
    ("csv-stdin", ["check", "csv", "-"], b"a,b\n1,2\n3,4\n"),
    ("csv-missing-file", ["check", "csv", "nope.csv"], b""),
    ("json", ["check", "json", "data.json", "--json"], b""),
    ("grep", ["check", "grep", "load_rates", "pkg"], b""),
    ("redact-stdin", ["check", "redact"], b"token=ghp_abcdefghijklmnopqrstuvwxyz0123456789\n"),
    ("scope-stdin", ["check", "scope", "-", "--allow", "pkg/"], b"not a diff\n"),
    ("py-eval", ["py", "eval", "print(1)"], b""),
    ("py-eval-json", ["py", "eval", "print(sum(range(10)))", "--json"], b""),
    ("py-eval-stdin", ["py", "eval", "-"], b"print('from stdin')\n"),
    ("py-eval-raises", ["py", "eval", "raise ValueError('boom')"], b""),
    (
        "py-run-tests",
        ["py", "run", "snippet.py", "--file", "rate_card.csv", "--test", "snippet_test.py"],
        b"",
    ),
    (
        "py-run-failing",
        ["py", "run", "snippet.py", "--file", "rate_card.csv", "--test", "failing_test.py"],
        b"",
    ),
    ("py-bad-option", ["py", "eval", "--fuel", "-3", "print(1)"], b""),
    ("py-no-such-command", ["py", "nope"], b""),
    ("run-python-wasm", ["run", "--tier", "python-wasm", "--python", "print(2)"], b""),
    ("run-nothing", ["run"], b""),
    ("map", ["map", ".", "--tokens", "256"], b""),
    ("map-json", ["map", ".", "--json", "--task", "rate card total"], b""),
    ("skeleton", ["skeleton", "pkg/rates.py"], b""),
    (
        "context-pack",
        ["context", "pack", ".", "--task", "fix Card.total rounding", "--tokens", "400"],
        b"",
    ),
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("parity")
    for name, text in REPO.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    yield root


@pytest.mark.parametrize(("args", "stdin"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_same_result_through_the_server(
    server: Server, repo: Path, args: list[str], stdin: bytes
) -> None:
    before = server.status()
    assert before is not None
    served = server.hybrid(*args, stdin=stdin, cwd=repo)
    after = server.status()
    assert after is not None and after["commands"] > before["commands"], "not served"
    local = server.local(*args, stdin=stdin, cwd=repo)
    assert (served.returncode, normal(served.stdout), normal(served.stderr)) == (
        local.returncode,
        normal(local.stdout),
        normal(local.stderr),
    )


def test_commands_not_forwarded_run_in_the_client(server: Server) -> None:
    before = server.status()
    done = server.hybrid("policy", "--help")
    assert done.returncode == 0 and "Usage" in done.stdout
    after = server.status()
    assert before is not None and after is not None
    assert after["commands"] == before["commands"]  # --status goes to the daemon: no command


def test_opting_out_runs_in_process(server: Server, repo: Path) -> None:
    for env, flag in (({"HYBRID_NO_SERVER": "1"}, []), ({}, ["--no-server"])):
        before = server.status()
        done = server.hybrid(*flag, "check", "csv", "rate_card.csv", cwd=repo, **env)
        after = server.status()
        assert done.returncode == 0, done.stderr
        assert before is not None and after is not None
        assert after["commands"] == before["commands"]  # --status goes to the daemon: no command


def test_output_streams_to_the_clients_pipe(server: Server) -> None:
    # stdout is the client's own pipe: a reader sees EOF when the command ends, not later.
    with subprocess.Popen(
        [*CLIENT, "py", "eval", "print('x' * 100000)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=server.env,
    ) as proc:
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert out == b"x" * 100000 + b"\n"


def _interrupt(env: dict[str, str], signum: int, busy: Any) -> tuple[int, bytes]:
    """Start an endless snippet, wait until it runs, send ``signum``: (exit code, stderr)."""
    proc = subprocess.Popen(
        [*CLIENT, "py", "eval", "--timeout", "120", "--fuel", "1000000000000", "while True: pass"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    busy()
    time.sleep(1.0)
    started = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 30
    return proc.returncode, err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_job_as_in_process(server: Server, signum: int) -> None:
    served = _interrupt(
        server.env,
        signum,
        lambda: wait_for(lambda: (server.status() or {}).get("busy", 0) >= 1, 60, "the job"),
    )
    local = _interrupt({**server.env, "HYBRID_NO_SERVER": "1"}, signum, lambda: time.sleep(3))
    assert served == local
    assert served[0] == (130 if signum == signal.SIGINT else 128 + signum)
    # The worker that ran it is replaced; the server serves on.
    done = server.hybrid("py", "eval", "print(3)")
    assert (done.returncode, done.stdout) == (0, "3\n")


def test_a_killed_client_stops_its_job(server: Server) -> None:
    proc = subprocess.Popen(
        [*CLIENT, "py", "eval", "--timeout", "120", "--fuel", "1000000000000", "while True: pass"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=server.env,
    )
    wait_for(lambda: (server.status() or {}).get("busy", 0) >= 1, 60, "the job to start")
    proc.kill()
    proc.wait()
    # No worker is busy once the job is stopped (well before its 120 s); --status takes none.
    wait_for(lambda: (server.status() or {}).get("busy", 0) == 0, 30, "the job to stop")


def test_the_runtime_directory_is_private(server: Server) -> None:
    assert not gone(server.pids()[0])
    assert os.stat(server.runtime).st_mode & 0o777 == 0o700


def _on_a_terminal(env: dict[str, str], cwd: Path, *args: str) -> tuple[int, bytes]:
    """Run the client with stdin, stdout and stderr on a pseudo-terminal: (exit code, output)."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: become the client
        os.chdir(cwd)
        os.execve(CLIENT[0], [*CLIENT, *args], env)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), b"".join(chunks)


def test_a_terminal_stays_a_terminal(server: Server, repo: Path) -> None:
    args = ("py", "run", "snippet.py", "--file", "rate_card.csv", "--test", "failing_test.py")
    before = (server.status() or {})["commands"]
    served = _on_a_terminal(server.env, repo, *args)
    assert (server.status() or {})["commands"] > before
    local = _on_a_terminal({**server.env, "HYBRID_NO_SERVER": "1"}, repo, *args)
    assert served[0] == local[0] == 1
    assert b"\x1b[31mFAIL" in served[1]  # colour: the command saw a terminal
    assert normal(served[1].decode()) == normal(local[1].decode())
