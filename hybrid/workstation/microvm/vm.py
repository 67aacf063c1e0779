"""One QEMU ``-M microvm`` process: launch (cold or from a snapshot), its agent channel, QMP.

A cold boot to the first command takes ~2.2 s under TCG; a *template* (a VM booted to a ready
agent, saved with QEMU's migration to a file, before anything is mounted) restores in ~0.3 s.
Templates are keyed by the artifacts and by what the migration stream must match: the machine,
CPU and kernel command line, RAM size, vCPUs and the number of 9p shares. The share *paths* are
not in the stream (9p blocks migration only while mounted, and the template never mounts), so
one template serves every workspace.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import functools
import hashlib
import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybrid.errors import EngineUnavailable, InvalidInput, WorkstationError
from hybrid.workstation import jobuser
from hybrid.workstation.microvm.build import Artifacts, cache

QEMU = "qemu-system-x86_64"
MAX_LINE = 1024**2
"""The longest message the guest agent may send (its output chunks are 64 KiB, ~88 KiB as JSON):
a longer line is a guest failure, not a buffer that grows until the host runs out of memory."""
BOOT_SECONDS = float(os.environ.get("HYBRID_MICROVM_BOOT_SECONDS", "120"))
"""How long a boot (or restore) may take to a ready agent before it counts as failed."""
_PR_SET_PDEATHSIG = 1
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


MACHINE = "microvm,x-option-roms=off,rtc=on,pic=off,pit=off,isa-serial=on"
"""QEMU's machine. rtc=on: without a CMOS clock the guest kernel waits a second for one twice
(timekeeping, then the rtc_cmos probe), a third of a cold boot under TCG. A snapshot restores only
into the machine it was taken on, so this string is part of a template's key."""
TCG_CPU = "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt"
"""The emulated CPU: x86-64-v2, what distributions and wheels assume. Cold boots to the first
command took 2.36 s on ``max`` and 2.11 s on this here (both with mitigations=off): the kernel's
paths for ``max``'s extra features cost time under emulation."""


@dataclass(frozen=True)
class Shape:
    """What a VM's migration stream depends on besides the artifacts."""

    memory_mib: int
    cpus: int
    shares: int

    def key(self, artifacts: Artifacts) -> str:
        # A snapshot restores only into the machine, CPU and kernel command line it was taken on.
        machine = hashlib.sha256(
            f"{MACHINE} {TCG_CPU} {kernel_command_line()}".encode()
        ).hexdigest()[:8]
        return f"{artifacts.key}-{machine}-m{self.memory_mib}-c{self.cpus}-s{self.shares}"


@dataclass
class Share:
    """A host directory the guest mounts over 9p."""

    tag: str
    host: Path
    guest: str
    read_only: bool


@functools.cache
def tsc_khz() -> int:
    """The host's TSC rate: a TCG guest reads the host's TSC and must not calibrate it (slow, flaky)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return int(float(line.split(":")[1]) * 1000)
    return 2_000_000


def accel() -> tuple[str, str]:
    """(accelerator, why): TCG unless HYBRID_MICROVM_ACCEL=kvm asks for KVM and /dev/kvm is usable.

    This host's /dev/kvm is PVM (paravirtual KVM, module kvm_pvm): a stock guest kernel does
    not boot on it, so KVM is never picked by default when kvm_pvm is loaded.
    """
    wanted = os.environ.get("HYBRID_MICROVM_ACCEL", "")
    if wanted == "tcg":
        return "tcg", "HYBRID_MICROVM_ACCEL=tcg"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg", "no usable /dev/kvm: TCG (software emulation, ~15x slower guest code)"
    if Path("/sys/module/kvm_pvm").exists() and wanted != "kvm":
        return "tcg", (
            "/dev/kvm is PVM (paravirtual KVM, kvm_pvm) that a stock Debian kernel cannot boot on: "
            "TCG (software emulation)"
        )
    return "kvm", "/dev/kvm (hardware virtualization)"


def kernel_command_line() -> str:
    """The guest kernel's command line: quiet, no probing of what the machine does not have."""
    words = [
        "console=ttyS0",
        *(() if os.environ.get("HYBRID_MICROVM_DEBUG") else ("quiet", "loglevel=1")),
        "panic=-1",
        "reboot=t",
        f"tsc_early_khz={tsc_khz()}",
        "tsc=reliable",
        "no_timer_check",
        "cryptomgr.notests",
        "apparmor=0",
        "audit=0",
        "8250.nr_uarts=1",
        "i8042.noaux",
        "rdinit=/init",
    ]
    if accel()[0] == "tcg":
        # An emulator executes no guest code speculatively: there is nothing for Spectre or
        # Meltdown mitigations to guard, only their cost (page-table switches on every syscall).
        words.append("mitigations=off")
    return " ".join(words)


def qemu_path(path: Path | str) -> str:
    """A path as a QEMU option value (``-drive file=...,``): a comma doubled, as QEMU reads it,
    so no path can end the value and add options of its own; control characters refused."""
    text = os.fspath(path)
    if _CONTROL.search(text):
        raise InvalidInput(f"{text!r}: a path QEMU is given must not contain control characters")
    return text.replace(",", ",,")


def plain_path(path: Path | str) -> str:
    """A path QEMU takes whole (``-kernel``, ``-serial file:``): control characters refused."""
    text = os.fspath(path)
    if _CONTROL.search(text):
        raise InvalidInput(f"{text!r}: a path QEMU is given must not contain control characters")
    return text


def argv(
    artifacts: Artifacts, shape: Shape, home: Path, shares: list[Share], incoming: Path | None
) -> list[str]:
    """The QEMU command line (identical for a template and its restores, but for -incoming).

    Every path in an option list goes through ``qemu_path``; the kernel command line holds no
    value from a spec or a caller.
    """
    accelerator, _why = accel()
    append = kernel_command_line()
    args = [
        QEMU,
        "-M",
        MACHINE,
        "-accel",
        accelerator,
        "-cpu",
        TCG_CPU if accelerator == "tcg" else "host",
        "-m",
        f"{shape.memory_mib}M",
        "-smp",
        str(shape.cpus),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-kernel",
        plain_path(artifacts.kernel),
        "-initrd",
        plain_path(artifacts.initramfs),
        "-append",
        append,
        "-serial",
        f"file:{plain_path(home / 'console.log')}",  # the rest of the word, commas and all
        "-drive",
        f"id=root,file={qemu_path(artifacts.rootfs)},format=raw,if=none,readonly=on",
        "-device",
        "virtio-blk-device,drive=root",
        "-device",
        "virtio-serial-device",
        "-chardev",
        f"socket,id=agent,path={qemu_path(home / 'agent.sock')},server=on,wait=off",
        "-device",
        "virtserialport,chardev=agent,name=hybrid.agent",
        "-qmp",
        f"unix:{qemu_path(home / 'qmp.sock')},server=on,wait=off",
    ]
    for share in shares:
        args += [
            "-fsdev",
            f"local,id={share.tag},path={qemu_path(share.host)},security_model=passthrough"
            + (",readonly=on" if share.read_only else ""),
            "-device",
            f"virtio-9p-device,fsdev={share.tag},mount_tag={share.tag}",
        ]
    if incoming is not None:
        # exec: runs through /bin/sh: the path is one quoted word.
        args += ["-incoming", f"exec:cat {shlex.quote(plain_path(incoming))}"]
    return args


class Machine:
    """A running QEMU process and its agent channel; ``close()`` kills it (idempotent)."""

    def __init__(
        self,
        artifacts: Artifacts,
        shape: Shape,
        home: Path,
        shares: list[Share],
        *,
        incoming: Path | None = None,
        tied: bool = True,
    ) -> None:
        self.home = home
        self.shape = shape
        if len(os.fsencode(home / "agent.sock")) > 107:
            raise WorkstationError(
                f"{home} is too deep for the VM's Unix sockets (107 bytes at most): "
                "point HYBRID_STATE_DIR or HYBRID_MICROVM_CACHE at a shorter directory"
            )
        home.mkdir(parents=True, exist_ok=True)
        for stale in ("agent.sock", "qmp.sock"):
            with contextlib.suppress(FileNotFoundError):
                (home / stale).unlink()
        if shutil.which(QEMU) is None:
            raise EngineUnavailable("the microvm tier needs QEMU: apt-get install qemu-system-x86")
        self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
            argv(artifacts, shape, home, shares, incoming),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(home / "qemu.log", "ab"),  # noqa: SIM115 - the child holds it
            start_new_session=True,
            # A VM made for one call dies with the thread that made it, even on SIGKILL.
            preexec_fn=_die_with_parent if tied else None,
        )
        self.pid = self.process.pid
        (home / "qemu.pid").write_text(str(self.pid))
        self._init_channel()

    @classmethod
    def attach(cls, home: Path, pid: int) -> Machine:
        """The machine of a workstation another process started (QEMU ``pid``, still running)."""
        machine = cls.__new__(cls)
        machine.home = home
        machine.process = None
        machine.pid = pid
        machine._init_channel()
        return machine

    def _init_channel(self) -> None:
        self._sock: socket.socket | None = None
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._next = 0
        self._reader: threading.Thread | None = None
        self._closed = False
        self.failure = ""
        """Why the guest is no longer trusted (it broke the protocol); empty while it is."""

    # -- the agent channel ------------------------------------------------------------------

    def connect(self, timeout: float = BOOT_SECONDS) -> None:
        """Wait for the agent to answer (boot or restore done)."""
        until = time.monotonic() + timeout
        path = str(self.home / "agent.sock")
        while True:
            self._check_alive()
            if time.monotonic() > until:
                raise WorkstationError(f"the microVM did not start in {timeout:g} s{self._why()}")
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(path)
            except OSError:
                sock.close()
                time.sleep(0.02)
                continue
            break
        self._sock = sock
        # The reader keeps its own reference: _disconnect() clears self._sock while it may be
        # inside recv(), and the closed socket must end it with OSError, not AttributeError.
        self._reader = threading.Thread(
            target=self._read, args=(sock,), name="hybrid-microvm-agent", daemon=True
        )
        self._reader.start()
        while True:
            with contextlib.suppress(TimeoutError):
                self.call({"op": "ping"}, timeout=0.25)
                return
            self._check_alive()
            if time.monotonic() > until:
                raise WorkstationError(
                    f"the microVM's agent did not answer in {timeout:g} s{self._why()}"
                )

    def call(self, request: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        """One request and its single reply (TimeoutError when none comes)."""
        ident, replies = self._open()
        try:
            self._send({**request, "id": ident})
            try:
                reply = replies.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(request.get("op")) from None
        finally:
            self._replies.pop(ident, None)
        if reply.get("gone"):
            if self.failure:
                raise GuestFailure(f"{self.failure}; the microVM is no longer trusted")
            raise WorkstationError(f"the microVM stopped{self._why()}")
        if "error" in reply:
            raise WorkstationError(f"microVM agent: {str(reply['error'])[:300]}")
        return reply

    def stream(
        self, request: dict[str, Any], until: float
    ) -> Generator[dict[str, Any], None, None]:
        """Send ``request`` and yield its messages up to and including the one with ``end``."""
        ident, replies = self._open()
        try:
            self._send({**request, "id": ident})
            while True:
                left = until - time.monotonic()
                try:
                    message = replies.get(timeout=max(left, 0.01))
                except queue.Empty:
                    yield {"end": True, "lost": True}
                    return
                yield message
                if message.get("end") or message.get("gone"):
                    return
        finally:
            self._replies.pop(ident, None)

    def _open(self) -> tuple[int, queue.Queue[dict[str, Any]]]:
        with self._lock:
            self._next += 1
            ident = self._next
            replies: queue.Queue[dict[str, Any]] = queue.Queue()
            self._replies[ident] = replies
        return ident, replies

    def _send(self, message: dict[str, Any]) -> None:
        if self.failure:
            raise GuestFailure(f"{self.failure}; the microVM is no longer trusted")
        if self._sock is None:
            raise WorkstationError("the microVM is not connected")
        data = (json.dumps(message) + "\n").encode()
        with self._lock:
            try:
                self._sock.sendall(data)
            except OSError as exc:
                raise WorkstationError(
                    f"the microVM's agent is gone ({exc.strerror}){self._why()}"
                ) from None

    def _read(self, sock: socket.socket) -> None:
        # The guest is as hostile as the job in it (a job that takes its kernel holds the agent's
        # end): a line over MAX_LINE or a message that is not a JSON object with an integer id
        # ends the channel, and every waiting call fails with WorkstationError.
        reason = "the channel closed"
        try:
            for line in read_lines(sock, MAX_LINE):
                message = parse_message(line)
                target = self._replies.get(message["id"])
                if target is not None:
                    target.put(message)
        except GuestFailure as exc:
            reason = self.failure = exc.message
        except OSError:
            pass
        for waiting in list(self._replies.values()):
            waiting.put({"gone": True, "end": True, "failure": reason})

    # -- control ------------------------------------------------------------------------------

    def save(self, target: Path) -> None:
        """Write the running VM's state to ``target`` (QEMU migration to a file), then stop it."""
        self._disconnect()
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        qmp = _Qmp(self.home / "qmp.sock")
        try:
            qmp.command("migrate", uri=f"exec:cat > {shlex.quote(plain_path(tmp))}")
            until = time.monotonic() + 120
            while True:
                status = qmp.command("query-migrate").get("status")
                if status == "completed":
                    break
                if status in ("failed", "cancelled") or time.monotonic() > until:
                    raise WorkstationError(f"saving the microVM failed ({status})")
                time.sleep(0.02)
        finally:
            qmp.close()
        os.replace(tmp, target)

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        try:
            return str(self.home).encode() in Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return False

    def detach(self) -> None:
        """Leave the VM running (a persistent workstation) and drop the connection."""
        self._closed = True
        self._disconnect()

    def close(self) -> None:
        """Kill QEMU and reap it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._disconnect()
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()
        else:
            for _ in range(500):
                if not self.alive():
                    break
                time.sleep(0.01)
        for name in ("agent.sock", "qmp.sock", "qemu.pid"):
            with contextlib.suppress(FileNotFoundError):
                (self.home / name).unlink()

    def _disconnect(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(5)
            self._reader = None

    def _check_alive(self) -> None:
        if not self.alive():
            status = self.process.returncode if self.process is not None else "?"
            raise WorkstationError(f"QEMU exited with status {status}{self._why()}")

    def _why(self) -> str:
        for name in ("qemu.log", "console.log"):
            with contextlib.suppress(OSError):
                lines = [
                    line
                    for line in (self.home / name).read_text(errors="replace").splitlines()
                    if line.strip()
                ]
                if lines:
                    return f" ({name}: {lines[-1][:200]})"
        return ""


GUEST_FAILURE = "the microVM's agent sent a malformed message"


class GuestFailure(WorkstationError):
    """The guest agent broke its protocol (a line too long, not a JSON object, a bad field)."""


def read_lines(sock: socket.socket, limit: int) -> Generator[bytes, None, None]:
    """Lines from ``sock`` until it closes; GuestFailure for a line of more than ``limit`` bytes
    (nothing beyond ``limit`` plus one read is ever held)."""
    pending = bytearray()
    while True:
        data = sock.recv(262144)
        if not data:
            return
        pending += data
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            if end - start > limit:
                break
            yield bytes(pending[start:end])
            start = end + 1
        del pending[:start]
        if len(pending) > limit:
            raise GuestFailure(f"{GUEST_FAILURE}: a line of more than {limit} bytes")


def check_end(message: dict[str, Any]) -> dict[str, Any]:
    """An exec's last message, its fields of the types the agent writes; GuestFailure otherwise."""
    fields = {
        "code": (int, type(None)),
        "signal": (int, type(None)),
        "timed_out": (bool,),
        "oom": (bool,),
        "cut": (list,),
        "error": (str,),
    }
    for name, types in fields.items():
        if name in message and type(message[name]) not in types:
            raise GuestFailure(f"{GUEST_FAILURE}: {name} is a {type(message[name]).__name__}")
    if not all(kind in ("stdout", "stderr") for kind in message.get("cut") or ()):
        raise GuestFailure(f"{GUEST_FAILURE}: cut names an unknown stream")
    return message


def parse_message(line: bytes) -> dict[str, Any]:
    """One agent message: a JSON object with an integer ``id``; GuestFailure otherwise."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: brackets nested past the stack
        raise GuestFailure(f"{GUEST_FAILURE}: not JSON ({line[:60]!r})") from None
    if not isinstance(message, dict):
        raise GuestFailure(f"{GUEST_FAILURE}: a JSON {type(message).__name__}, not an object")
    if type(message.get("id")) is not int:
        raise GuestFailure(f"{GUEST_FAILURE}: no integer id")
    return message


class _Qmp:
    """The least of QMP: capabilities, then one command at a time (events are skipped)."""

    def __init__(self, path: Path) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(30)
        self._sock.connect(str(path))
        self._file = self._sock.makefile("rb")
        self._file.readline()  # greeting
        self.command("qmp_capabilities")

    def command(self, name: str, **arguments: Any) -> dict[str, Any]:
        message: dict[str, Any] = {"execute": name}
        if arguments:
            message["arguments"] = arguments
        self._sock.sendall(json.dumps(message).encode() + b"\n")
        while True:
            line = self._file.readline()
            if not line:
                raise WorkstationError(f"QMP closed during {name}")
            reply = json.loads(line)
            if "event" in reply:
                continue
            if "error" in reply:
                raise WorkstationError(f"QMP {name}: {reply['error'].get('desc')}")
            result: dict[str, Any] = reply.get("return") or {}
            return result

    def close(self) -> None:
        self._file.close()
        self._sock.close()


def template(artifacts: Artifacts, shape: Shape) -> Path:
    """The snapshot of a booted, idle VM of ``shape`` (made on first use, then shared)."""
    key = shape.key(artifacts)
    target = cache() / "templates" / f"{key}.vmstate"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # A short name: QEMU's sockets live in it, and a Unix socket path has 107 bytes at most.
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        empty = scratch / "empty"
        empty.mkdir()
        shares = [Share(f"s{i}", empty, "", True) for i in range(shape.shares)]
        machine = Machine(artifacts, shape, scratch, shares)
        try:
            machine.connect()
            # One command first, so the snapshot holds python3 and its libraries in its page cache.
            warm = {
                "op": "exec",
                "argv": ["/usr/bin/python3", "-c", "import json, subprocess"],
                "env": {"PATH": "/usr/bin:/bin"},
                "cwd": "/",
                "timeout": BOOT_SECONDS,
                "limit": 4096,
                "uid": jobuser.JOB_UID,
            }
            for _message in machine.stream(warm, time.monotonic() + BOOT_SECONDS):
                pass
            machine.save(target)
        finally:
            machine.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class Output:
    """Output of one exec, capped per stream."""

    limit: int
    on_output: Callable[[str, bytes], None] | None
    kept: dict[str, bytearray] = field(
        default_factory=lambda: {"stdout": bytearray(), "stderr": bytearray()}
    )
    cut: dict[str, bool] = field(default_factory=lambda: {"stdout": False, "stderr": False})

    def add(self, kind: object, data: object) -> None:
        if kind not in ("stdout", "stderr") or not isinstance(data, str):
            raise GuestFailure(f"{GUEST_FAILURE}: output of stream {kind!r}")
        try:
            chunk = base64.b64decode(data, validate=True)
        except ValueError:
            raise GuestFailure(f"{GUEST_FAILURE}: output that is not base64") from None
        room = self.limit - len(self.kept[kind])
        if len(chunk) > room:
            self.cut[kind] = True
            chunk = chunk[: max(room, 0)]
        if chunk:
            self.kept[kind].extend(chunk)
            if self.on_output is not None:
                self.on_output(kind, bytes(chunk))
