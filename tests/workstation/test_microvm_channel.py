"""The host's end of the microVM agent channel against a hostile guest.

A guest that a job has taken over holds the agent's end of the channel. Its messages reach the
host's line reader (``vm.Machine``) over the real Unix socket QEMU would serve; here a stand-in
agent on that socket answers pings like the real one, then misbehaves: a line with no end, JSON
that is not an object, bad fields. Each must end the channel with a WorkstationError at once
(never a dead reader thread and callers waiting out their timeouts, never a buffer that grows
with whatever the guest sends).
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hybrid.errors import WorkstationError
from hybrid.workstation.microvm import vm

Behaviour = Callable[[socket.socket, dict[str, object]], None]


class FakeAgent:
    """A listener on ``home/agent.sock`` that answers pings and hands other requests to ``act``."""

    def __init__(self, home: Path, act: Behaviour) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(home / "agent.sock"))
        self.server.listen(1)
        self.act = act
        self.sent_all = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                request = json.loads(line)
                if request.get("op") == "ping":
                    conn.sendall(json.dumps({"id": request["id"], "pong": True}).encode() + b"\n")
                else:
                    try:
                        self.act(conn, request)
                    except OSError:
                        return  # the host closed its end: what a bounded reader does

    def close(self) -> None:
        self.server.close()
        self.thread.join(10)


@pytest.fixture
def machine_with(tmp_path: Path) -> Iterator[Callable[[Behaviour], vm.Machine]]:
    """machine_with(act): a Machine attached to a stand-in VM process whose agent does ``act``."""
    made: list[tuple[vm.Machine, FakeAgent, subprocess.Popen[bytes]]] = []

    def make(act: Behaviour) -> vm.Machine:
        home = tmp_path / f"vm{len(made)}"
        home.mkdir()
        agent = FakeAgent(home, act)
        # Machine.attach trusts a pid whose command line names the VM's directory, as QEMU's does.
        stand_in = subprocess.Popen(
            ["/bin/sh", "-c", "sleep 120", str(home)], start_new_session=True
        )
        cmdline = Path(f"/proc/{stand_in.pid}/cmdline")
        until = time.monotonic() + 10
        while str(home).encode() not in cmdline.read_bytes() and time.monotonic() < until:
            time.sleep(0.01)  # forked, not yet exec'd
        machine = vm.Machine.attach(home, stand_in.pid)
        machine.connect(timeout=20)
        made.append((machine, agent, stand_in))
        return machine

    yield make
    for machine, agent, stand_in in made:
        machine.close()
        agent.close()
        stand_in.wait(10)


def _answer(conn: socket.socket, request: dict[str, object], line: bytes) -> None:
    conn.sendall(line)


@pytest.mark.parametrize(
    "line",
    [
        b"[1, 2]\n",  # JSON, but a list
        b"5\n",
        b'"text"\n',
        b"null\n",
        b"{not json\n",
        b'{"id": "1", "pong": true}\n',  # an id the host never gave, of the wrong type
        b"[" * 200_000 + b"\n",  # nested past the parser's recursion limit
    ],
    ids=["list", "number", "string", "null", "not-json", "string-id", "deep"],
)
def test_a_malformed_message_is_a_guest_failure(
    machine_with: Callable[[Behaviour], vm.Machine], line: bytes
) -> None:
    machine = machine_with(lambda conn, request: _answer(conn, request, line))
    started = time.monotonic()
    with pytest.raises(WorkstationError, match="malformed message"):
        machine.call({"op": "hello"}, timeout=60)
    assert time.monotonic() - started < 10, "the caller waited out its timeout"
    assert machine.failure.startswith(vm.GUEST_FAILURE)
    # Nothing more is asked of a guest that broke the protocol.
    with pytest.raises(WorkstationError, match="no longer trusted"):
        machine.call({"op": "ping"}, timeout=5)


def test_an_endless_line_is_a_guest_failure_and_is_not_buffered(
    machine_with: Callable[[Behaviour], vm.Machine],
) -> None:
    total = 64 * vm.MAX_LINE
    sent = [0]

    def flood(conn: socket.socket, request: dict[str, object]) -> None:
        conn.settimeout(5)  # a reader that stopped reading leaves the rest unsent
        chunk = b"x" * 65536
        while sent[0] < total:
            conn.sendall(chunk)
            sent[0] += len(chunk)
        conn.sendall(b"\n")

    machine = machine_with(flood)
    started = time.monotonic()
    with pytest.raises(WorkstationError, match=f"more than {vm.MAX_LINE} bytes"):
        machine.call({"op": "exec"}, timeout=60)
    assert time.monotonic() - started < 30
    time.sleep(6)  # the agent's send times out once the host stops reading
    assert sent[0] < total // 4, f"the host read {sent[0]} bytes of one line"


def test_a_long_but_bounded_line_is_read(machine_with: Callable[[Behaviour], vm.Machine]) -> None:
    """An honest reply near the limit (the agent's output chunks are far smaller) still arrives."""
    payload = "y" * (vm.MAX_LINE - 100)

    def reply(conn: socket.socket, request: dict[str, object]) -> None:
        conn.sendall(json.dumps({"id": request["id"], "data": payload}).encode() + b"\n")

    machine = machine_with(reply)
    assert machine.call({"op": "big"}, timeout=30)["data"] == payload


def test_malformed_exec_messages_are_guest_failures() -> None:
    output = vm.Output(1024, None)
    for kind, data in (("stdin", "eA=="), ("stdout", "not base64!"), ("stdout", 5)):
        with pytest.raises(WorkstationError, match="malformed message"):
            output.add(kind, data)
    for end in ({"code": "0"}, {"cut": "stdout"}, {"cut": ["/etc"]}, {"timed_out": 1}):
        with pytest.raises(WorkstationError, match="malformed message"):
            vm.check_end({"id": 1, "end": True, **end})
    assert vm.check_end({"id": 1, "end": True, "code": 0, "cut": ["stdout"]})["code"] == 0


def test_qemu_paths_cannot_add_options() -> None:
    """A path with a comma stays one value of a QEMU option list; a control character is refused."""
    assert vm.qemu_path("/a,readonly=off,b") == "/a,,readonly=off,,b"
    from hybrid.errors import InvalidInput

    for bad in ("/a\0b", "/a\nb"):
        with pytest.raises(InvalidInput):
            vm.qemu_path(bad)
        with pytest.raises(InvalidInput):
            vm.plain_path(bad)
