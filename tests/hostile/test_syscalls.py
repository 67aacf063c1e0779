"""Syscalls that weaken a job or leave its network namespace, on every tier.

``personality(READ_IMPLIES_EXEC)`` makes every readable mapping executable (and
``ADDR_NO_RANDOMIZE`` turns ASLR off); ``socket(AF_VSOCK)`` reaches the host or a VM past every
network namespace, also through the i386 ABI (``int 0x80`` from a 64-bit process), which a filter
written for the native ABI does not see. The bwrap tier's seccomp filter allowed the first two,
and Docker 20.10's default seccomp profile allowed vsock (natively and through i386). Where the
job's syscalls meet the host kernel (bwrap, docker runc) all of them fail with EPERM (a foreign ABI
kills the process). gVisor answers them in a kernel of its own: no persona but PER_LINUX
(EINVAL), no AF_VSOCK (EAFNOSUPPORT), no i386 ABI (ENOSYS). A microVM's guest kernel is its own
and has no vsock device.
"""

from __future__ import annotations

import errno

import pytest
from hostile_kit import Attack, Driver

pytestmark = pytest.mark.timeout(300)

HOST_KERNEL_TIERS = ("bwrap", "docker", "workstation")
"""Tiers whose jobs' syscalls meet the host kernel."""

PROBE = """
import socket
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.personality.argtypes = [ctypes.c_ulong]
except (ImportError, OSError) as exc:
    print("no ctypes", type(exc).__name__)
    raise SystemExit(0)
for name, persona in (("read_implies_exec", 0x0400000), ("addr_no_randomize", 0x0040000)):
    ctypes.set_errno(0)
    rc = libc.personality(persona)
    now = libc.personality(0xFFFFFFFF)
    print("personality", name, rc, ctypes.get_errno(), "active", bool(now & persona))
ctypes.set_errno(0)
fd = libc.socket(40, 1, 0)  # AF_VSOCK, SOCK_STREAM
print("vsock stream", fd, ctypes.get_errno())
try:
    socket.socket(40, socket.SOCK_DGRAM)
    print("vsock dgram 0 0")
except OSError as exc:
    print("vsock dgram -1", exc.errno)
import os, platform, sys
if platform.machine() == "x86_64":
    import mmap
    # i386 socket(AF_VSOCK, SOCK_STREAM, 0): eax=359, ebx=40, ecx=1, edx=0; int 0x80; ret
    code = bytes.fromhex("b867010000bb28000000b901000000ba00000000cd80c3")
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(code)
        call = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
        print("i386 socket", call(), flush=True)
        os._exit(0)
    status = os.waitpid(child, 0)[1]
    print("i386 signal", os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0)
"""


def test_weakening_syscalls(sandbox: Driver) -> None:
    if sandbox.kind == "wasi":
        pytest.skip("WASI preview 1 has neither personality nor sockets of any family")
    script = f"python3 - <<'EOF'\n{PROBE}\nEOF\n"
    result = sandbox.run(Attack(python=PROBE, shell=script), wall_seconds=30)
    lines = result.stdout.splitlines()
    if sandbox.kind == "python":
        assert lines and lines[0].startswith("no ctypes"), result
        return
    assert result.ok, result
    found = {tuple(line.split()[:2]): line.split() for line in lines}
    if sandbox.tier in HOST_KERNEL_TIERS:
        for persona in ("read_implies_exec", "addr_no_randomize"):
            words = found[("personality", persona)]
            assert words[2:4] == ["-1", str(errno.EPERM)], lines
            assert words[-1] == "False", f"{persona} took effect: {lines}"
    vsock = [found[("vsock", kind)] for kind in ("stream", "dgram")]
    assert [words[2] for words in vsock] == ["-1", "-1"], f"a vsock socket was created: {lines}"
    i386 = found.get(("i386", "socket"))
    if sandbox.tier in HOST_KERNEL_TIERS:
        assert [words[3] for words in vsock] == [str(errno.EPERM)] * 2, lines
        # The foreign ABI is refused whole: the process is killed (SIGSYS) before socket runs.
        assert i386 is None or int(i386[2]) < 0, f"an i386 vsock socket was created: {lines}"
    elif sandbox.tier == "gvisor":
        for persona in ("read_implies_exec", "addr_no_randomize"):
            words = found[("personality", persona)]
            assert words[2:4] in (["-1", str(errno.EPERM)], ["-1", str(errno.EINVAL)]), lines
        assert {words[3] for words in vsock} <= {str(errno.EPERM), str(errno.EAFNOSUPPORT)}, lines
        assert i386 is None or int(i386[2]) < 0, f"an i386 vsock socket was created: {lines}"
