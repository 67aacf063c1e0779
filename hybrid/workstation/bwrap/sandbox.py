"""One command in a bubblewrap sandbox: the bwrap arguments, and the supervised run.

Every namespace is private (user, pid, net, ipc, uts, mount, cgroup); the toolchain root and the
spec's mounts (staged by the workstation, workspace.bind) as asked, the workspace read-write;
/tmp is a private tmpfs and / itself is read-only. The environment is cleared and rebuilt from the spec; the arguments, secret values
included, reach bwrap through a memfd (``--args``), never through its visible command line.

The wrapper joins the workstation's cgroup before anything runs, drops to the sandbox user and
execs bwrap. The deadline SIGKILLs the sandbox's pid-namespace init (the kernel then kills every
process in the namespace, however it forked) and bwrap itself; ``--die-with-parent`` does the
same when the client dies.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hybrid.errors import EngineUnavailable, InvalidInput, WorkstationError
from hybrid.workstation import jobuser
from hybrid.workstation.bwrap import seccomp
from hybrid.workstation.bwrap.cgroups import Group
from hybrid.workstation.bwrap.rootfs import Root

SANDBOX_UID, SANDBOX_GID = jobuser.JOB_UID, jobuser.JOB_GID
"""Who commands run as, inside and (when the caller is root) on the host: ids no host account
has (hybrid.workstation.jobuser), the base image's ``agent`` user, as on the docker tier."""

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TMP_CAP = 1024**3
"""/tmp is a tmpfs of min(memory, 1 GiB), as on the docker tier."""

_JOIN = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; '
    'exec "$@"'
)
_SETUP_FAILED = 125


@dataclass
class Plan:
    """What one sandbox sees: root, workspace, mounts, working directory and environment."""

    root: Root
    workspace: Path
    workspace_target: str
    cwd: str
    env: dict[str, str]
    memory: int
    mounts: Sequence[tuple[Path, str, bool]] = ()  # (host source, target, writable)


@dataclass
class Outcome:
    """How a supervised run ended, before it becomes an ExecutionResult."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    cut: dict[str, bool]
    timed_out: bool
    wall_ms: float
    started: bool = field(default=True)


def bwrap_args(plan: Plan) -> list[str]:
    """bwrap's arguments for ``plan``."""

    args = ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
    args += ["--new-session", "--cap-drop", "ALL", "--hostname", "sandbox"]
    args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    for kind, name, target in plan.root.entries():
        if kind == "symlink":
            args += ["--symlink", target, f"/{name}"]
        else:
            args += ["--ro-bind", target, f"/{name}"]
    args += ["--dev", "/dev", "--proc", "/proc"]
    args += ["--size", str(min(plan.memory, TMP_CAP)), "--perms", "1777", "--tmpfs", "/tmp"]
    args += ["--bind", str(plan.workspace), plan.workspace_target]
    for source, target, writable in plan.mounts:
        args += ["--bind" if writable else "--ro-bind", str(source), target]
    args += ["--remount-ro", "/", "--chdir", plan.cwd, "--clearenv"]
    for key, value in plan.env.items():
        args += ["--setenv", key, value]
    return args


def launch(
    plan: Plan, argv: Sequence[str], group: Group | None, status: int
) -> subprocess.Popen[bytes]:
    """Start ``argv`` under ``plan`` in ``group``; ``status`` is the write end of bwrap's JSON
    status pipe (child pid, exit code)."""
    fds: list[int] = []
    try:
        args = bwrap_args(plan)
        # The options go NUL-separated through a memfd: a NUL inside one would end it there and
        # make the rest more options (--share-net, --bind / ...). Callers check their values
        # (policy validators, exec_args); this is the last line, where the bytes are written.
        for what, values in (("sandbox option", args), ("command argument", argv)):
            bad = next((value for value in values if "\0" in value), None)
            if bad is not None:
                raise InvalidInput(f"{what} {bad!r}: must not contain a NUL byte")
        filter_fd = _memfd("hybrid-seccomp", seccomp.program())
        fds.append(filter_fd)
        args += ["--seccomp", str(filter_fd), "--json-status-fd", str(status)]
        args_fd = _memfd("hybrid-bwrap-args", b"".join(a.encode() + b"\0" for a in args))
        fds.append(args_fd)
        # The options (secret values among them) through the memfd; the command, which bwrap
        # only takes from its own command line, after them.
        command = ["bwrap", "--args", str(args_fd), "--", *argv]
        if os.geteuid() == 0:
            command = [
                "setpriv", "--reuid", str(SANDBOX_UID), "--regid", str(SANDBOX_GID),
                "--clear-groups", "--", *command,
            ]  # fmt: skip
        procs = group.procs_files() if group is not None else []
        wrapper = ["/bin/sh", "-c", _JOIN, "hybrid-bwrap", str(len(procs)), *procs, *command]
        try:
            return subprocess.Popen(
                wrapper,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(*fds, status),
                start_new_session=True,  # the client's terminal signals are ours to relay
            )
        except OSError as exc:
            raise EngineUnavailable(f"cannot start bwrap: {exc.strerror}") from None
    finally:
        for fd in fds:
            os.close(fd)


def run(
    plan: Plan,
    argv: Sequence[str],
    group: Group | None,
    *,
    deadline: float,
    limit: int,
    on_output: Callable[[str, bytes], None] | None,
    running: set[subprocess.Popen[bytes]],
) -> Outcome:
    """Run ``argv`` to its end or ``deadline``; keep ``limit`` bytes of each stream."""
    read_status, write_status = os.pipe()
    start = time.monotonic()
    try:
        child = launch(plan, argv, group, write_status)
    finally:
        os.close(write_status)
    running.add(child)
    kept = {"stdout": bytearray(), "stderr": bytearray()}
    cut = {"stdout": False, "stderr": False}
    lock = threading.Lock()
    failure: list[BaseException] = []

    def pump(kind: str, pipe: io.BufferedReader) -> None:
        try:
            for chunk in iter(lambda: pipe.read1(65536), b""):
                with lock:
                    room = limit - len(kept[kind])
                    if len(chunk) > room:
                        cut[kind] = True
                        chunk = chunk[: max(room, 0)]
                    if chunk:
                        kept[kind].extend(chunk)
                        if on_output is not None and not failure:
                            on_output(kind, bytes(chunk))
        except BaseException as exc:  # a raising on_output: stop the run, then re-raise
            failure.append(exc)
            kill_tree(child)

    assert child.stdout is not None and child.stderr is not None
    readers = [
        threading.Thread(target=pump, args=(kind, pipe), name="hybrid-bwrap-pump", daemon=True)
        for kind, pipe in (("stdout", child.stdout), ("stderr", child.stderr))
    ]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        child.wait(deadline)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        # Every path (deadline, Ctrl-C, SIGTERM turned into an exception) ends the namespace.
        if child.returncode is None:
            kill_tree(child)
        child.wait()
        for reader in readers:
            reader.join(10)
        running.discard(child)
        with os.fdopen(read_status, "rb") as status_pipe:
            status = status_pipe.read()
    if failure:
        raise failure[0]
    wall_ms = (time.monotonic() - start) * 1000
    code = child.returncode
    if code == _SETUP_FAILED and b"child-pid" not in status:
        raise WorkstationError("bwrap: could not join the workstation's cgroup")
    started = b"child-pid" in status
    if not started and not timed_out:
        first = kept["stderr"].decode(errors="replace").strip().splitlines() or [f"exit {code}"]
        raise WorkstationError(f"the sandbox did not start: {first[0]}")
    exit_code = _exit_code(status)
    return Outcome(
        exit_code if exit_code is not None and code is not None and code >= 0 else code,
        bytes(kept["stdout"]),
        bytes(kept["stderr"]),
        cut,
        timed_out,
        wall_ms,
        started,
    )


def kill_tree(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the sandbox's pid-namespace init (the kernel then ends every process in that
    namespace), then bwrap itself."""
    for pid in _children(child.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(child.pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _exit_code(status: bytes) -> int | None:
    # bwrap writes one JSON document per line: {"child-pid": N} then {"exit-code": N}.
    for line in status.splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and "exit-code" in doc:
                return int(doc["exit-code"])
    return None


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
