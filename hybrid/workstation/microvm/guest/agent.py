"""hybrid's guest agent: PID 1 of the microVM, serving the host over a virtio-serial port.

Requests and replies are JSON lines. Every command runs as an unprivileged user with no
capabilities and no_new_privs, in its own cgroup under ``/sys/fs/cgroup/jobs`` (whose memory
and pids limits are the workstation's), so a deadline kills the whole process tree at once
(``cgroup.kill``) and an OOM kill is counted. Output beyond the cap is read and dropped.
Standard library only: it runs on the guest's python3 with -I -S.
"""

import base64
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time

PORT_NAME = "hybrid.agent"
JOBS = "/sys/fs/cgroup/jobs"
SETPRIV = "/usr/bin/setpriv"
BUSYBOX = "/run/busybox"  # static: cheap to exec under emulation (init put it there)

_out = threading.Lock()
_statuses: dict[int, int] = {}
_reaped = threading.Condition()
_port = -1
_counter = [0]


def send(message):
    data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
    with _out:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(_port, view) :]
            except BlockingIOError:
                select.select([], [_port], [], 0.05)
            except OSError:
                return  # no host connected: the reply is lost, as the host is


def write(path, text):
    with open(path, "w") as handle:
        handle.write(text)


def mount(source, target, kind, options):
    argv = [BUSYBOX, "mount", "-t", kind, "-o", options, source, target]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"mount {target}: {done.stderr.strip()}")


def boot():
    # /tmp, /dev/shm and the jobs' cgroup are mounted by init (guest/init).
    os.environ["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    write("/proc/self/oom_score_adj", "-1000")
    threading.Thread(target=reap, daemon=True).start()


def reap():
    """PID 1 reaps every orphan; statuses of the commands it started are kept for their waiters."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(0.05)
            continue
        with _reaped:
            _statuses[pid] = status
            _reaped.notify_all()


def wait_pid(pid, until):
    with _reaped:
        while pid not in _statuses:
            left = until - time.monotonic()
            if left <= 0:
                return None
            _reaped.wait(left)
        return _statuses.pop(pid)


def setup(req):
    if "time" in req:
        set_clock(req["time"])
    write(JOBS + "/memory.max", str(req["memory"]))
    write(JOBS + "/pids.max", str(req["pids"]))
    uid = req["uid"]
    for share in req["shares"]:
        os.makedirs(share["path"], exist_ok=True)
        options = "trans=virtio,version=9p2000.L,msize=262144,cache=mmap,nosuid,nodev"
        mount(share["tag"], share["path"], "9p", options + (",ro" if share["ro"] else ""))
    # The root was an overlay only so the mount points could be made: from now on it is read-only.
    mount("root", "/", "overlay", "remount,ro")
    os.chdir(req.get("cwd") or "/")
    return {"uid": uid}


THRASH_WINDOW = 2.0
"""Seconds over which a job fully stalled on memory more than half the time counts as out of it."""


def supervise(pid, cgroup, until):
    """Wait for ``pid`` until ``until``; (status or None, thrashed).

    At its memory limit a job without swap can spend minutes reclaiming its own program's pages
    before the kernel's OOM killer acts (far longer under emulation), so a job that stalls on
    memory most of the time (PSI ``full``) is ended here as out of memory, as systemd-oomd does.
    """
    samples = []
    while True:
        status = wait_pid(pid, min(until, time.monotonic() + 0.25))
        if status is not None or time.monotonic() >= until:
            return status, False
        try:
            with open(cgroup + "/memory.pressure") as handle:
                full = next(line for line in handle if line.startswith("full"))
            stalled = int(full.rsplit("total=", 1)[1]) / 1e6
        except (OSError, StopIteration, ValueError):
            continue
        now = time.monotonic()
        samples.append((now, stalled))
        while samples and samples[0][0] < now - THRASH_WINDOW:
            samples.pop(0)
        span = now - samples[0][0]
        if span >= THRASH_WINDOW * 0.75 and stalled - samples[0][1] > span / 2:
            kill(cgroup)
            return wait_pid(pid, time.monotonic() + 10), True


def set_clock(now):
    # A VM restored from a snapshot wakes with the snapshot's time: the host's wins.
    if abs(time.time() - now) > 0.5:
        with contextlib.suppress(OSError):
            time.clock_settime(time.CLOCK_REALTIME, now)


def kill(cgroup):
    with contextlib.suppress(OSError):
        write(cgroup + "/cgroup.kill", "1")


def run(req):
    ident = req["id"]
    if "time" in req:
        set_clock(req["time"])
    _counter[0] += 1
    cgroup = f"{JOBS}/{_counter[0]}"
    os.mkdir(cgroup)
    limit = req["limit"]
    uid = str(req["uid"])
    wrapped = [
        "/bin/sh",
        "-c",
        'echo $$ > "$0/cgroup.procs" && exec "$@"',
        cgroup,
        SETPRIV,
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        *req["argv"],
    ]
    start = time.monotonic()
    until = start + req["timeout"]
    try:
        child = subprocess.Popen(
            wrapped,
            cwd=req["cwd"],
            env=req["env"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        os.rmdir(cgroup)
        message = f"{req['cwd']}: {exc.strerror}\n"
        send({"id": ident, "stream": "stderr", "data": base64.b64encode(message.encode()).decode()})
        send(
            {
                "id": ident,
                "end": True,
                "code": 127,
                "signal": None,
                "timed_out": False,
                "oom": False,
                "cut": [],
            }
        )
        return
    _running[ident] = cgroup
    cut = []

    def pump(kind, pipe):
        kept = 0
        fd = pipe.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            room = limit - kept
            if len(chunk) > room:
                if kind not in cut:
                    cut.append(kind)
                chunk = chunk[: max(room, 0)]
            if chunk:
                kept += len(chunk)
                send({"id": ident, "stream": kind, "data": base64.b64encode(chunk).decode()})
        pipe.close()

    readers = [
        threading.Thread(target=pump, args=(kind, pipe), daemon=True)
        for kind, pipe in (("stdout", child.stdout), ("stderr", child.stderr))
    ]
    for reader in readers:
        reader.start()
    status, thrashed = supervise(child.pid, cgroup, until)
    timed_out = status is None and not thrashed
    for reader in readers:
        reader.join(max(until - time.monotonic(), 0))
        if reader.is_alive():
            timed_out = True
    if timed_out:
        kill(cgroup)
        if status is None:
            status = wait_pid(child.pid, time.monotonic() + 10)
        for reader in readers:
            reader.join(10)
    oom = thrashed
    try:
        with open(cgroup + "/memory.events") as handle:
            oom = oom or any(
                line.split()[0] == "oom_kill" and line.split()[1] != "0" for line in handle
            )
    except OSError:
        pass
    _running.pop(ident, None)
    with contextlib.suppress(OSError):
        os.rmdir(cgroup)  # background processes it left keep it (stop() ends them)
    code = signal_ = None
    if status is not None:
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
        elif os.WIFSIGNALED(status):
            signal_ = os.WTERMSIG(status)
    send(
        {
            "id": ident,
            "end": True,
            "code": code,
            "signal": signal_,
            "timed_out": timed_out,
            "oom": oom,
            "cut": cut,
            "wall_ms": (time.monotonic() - start) * 1000,
        }
    )


_running: dict[int, str] = {}


def kill_all():
    for name in os.listdir(JOBS):
        path = f"{JOBS}/{name}"
        if os.path.isdir(path):
            kill(path)
            for _ in range(100):
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.01)


def handle(req):
    op = req.get("op")
    ident = req.get("id")
    try:
        if op == "exec":
            threading.Thread(target=run_safely, args=(req,), daemon=True).start()
            return
        if op == "ping":
            reply = {"pong": True}
        elif op == "setup":
            reply = setup(req)
        elif op == "kill":
            cgroup = _running.get(req["target"])
            if cgroup:
                kill(cgroup)
            reply = {}
        elif op == "kill_all":
            kill_all()
            reply = {}
        elif op == "sync":
            os.sync()
            reply = {}
        else:
            reply = {"error": f"unknown op {op!r}"}
    except Exception as exc:
        reply = {"error": f"{type(exc).__name__}: {exc}"}
    reply["id"] = ident
    send(reply)


def run_safely(req):
    try:
        run(req)
    except Exception as exc:
        send({"id": req["id"], "end": True, "error": f"{type(exc).__name__}: {exc}"})


def find_port():
    root = "/sys/class/virtio-ports"
    for _ in range(500):
        for name in os.listdir(root) if os.path.isdir(root) else ():
            try:
                with open(f"{root}/{name}/name") as handle:
                    if handle.read().strip() == PORT_NAME:
                        return f"/dev/{name}"
            except OSError:
                pass
        time.sleep(0.01)
    raise SystemExit("agent: no virtio-serial port " + PORT_NAME)


def main():
    global _port
    boot()
    _port = os.open(find_port(), os.O_RDWR | os.O_NONBLOCK)
    pending = b""
    while True:
        readable, _, _ = select.select([_port], [], [], 1.0)
        if not readable:
            continue
        try:
            data = os.read(_port, 65536)
        except BlockingIOError:
            continue
        if not data:
            # No host on the other end (between snapshot and restore, or a client gone): wait.
            pending = b""
            time.sleep(0.02)
            continue
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                try:
                    request = json.loads(line)
                except ValueError:
                    continue
                handle(request)


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # PID 1 must not exit quietly: say why, then power off
        print(f"agent: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        raise
