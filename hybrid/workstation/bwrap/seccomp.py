"""The bwrap tier's seccomp filter, assembled as classic BPF (no libseccomp needed).

A deny list, like Docker's default profile in spirit: what compilers, interpreters and test
runners use stays allowed; what reaches into other processes, the kernel or the mount table
fails with EPERM. So do ``personality`` with a persona Docker's profile does not allow
(READ_IMPLIES_EXEC makes every readable mapping executable, ADDR_NO_RANDOMIZE ends ASLR) and
``socket(AF_VSOCK)`` (vsock is not network-namespaced: it reaches the host or its hypervisor). A
syscall of a foreign ABI (i386 or x32 on x86_64) kills the process: its numbers differ, so a deny
list written for the native ABI would not hold there. ``clone`` with a namespace flag fails with
EPERM and ``clone3`` with ENOSYS (its flags live in memory a filter cannot read; libc falls back
to ``clone``).
"""

from __future__ import annotations

import errno
import functools
import platform
import struct

from hybrid.errors import EngineUnavailable

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_KILL_PROCESS = 0x80000000
_ERRNO = 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0's low word: little endian)
AF_VSOCK = 40
# personality(2) values allowed, as in Docker's default profile: PER_LINUX, PER_LINUX32, UNAME26,
# UNAME26|PER_LINUX32 and the query 0xffffffff. READ_IMPLIES_EXEC (0x0400000: every readable
# mapping executable) and ADDR_NO_RANDOMIZE (0x0040000: no ASLR) fail with EPERM.
PERSONAS = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

_NAMESPACE_FLAGS = (
    0x00000080  # CLONE_NEWTIME
    | 0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)

DENIED = (
    # other processes' memory and execution
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # the mount table and namespaces
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # the kernel itself: modules, kexec, reboot, swap, clocks, accounting, the log
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "acct",
    "syslog", "quotactl", "quotactl_fd", "lookup_dcookie", "vhangup", "sethostname",
    "setdomainname",
    # raw kernel interfaces
    "bpf", "perf_event_open", "userfaultfd", "open_by_handle_at", "name_to_handle_at",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "iopl", "ioperm", "modify_ldt",
    # the kernel keyring
    "keyctl", "add_key", "request_key",
)  # fmt: skip
"""Syscalls that fail with EPERM inside the sandbox."""

# name -> number, per architecture (arch/x86/entry/syscalls/syscall_64.tbl; the generic table
# include/uapi/asm-generic/unistd.h for aarch64, which has no iopl, ioperm or modify_ldt).
_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "pidfd_getfd": 438, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "unshare": 272, "setns": 308, "move_mount": 429, "open_tree": 428, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "init_module": 175,
    "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
    "reboot": 169, "swapon": 167, "swapoff": 168, "settimeofday": 164, "clock_settime": 227,
    "clock_adjtime": 305, "adjtimex": 159, "acct": 163, "syslog": 103, "quotactl": 179,
    "quotactl_fd": 443, "lookup_dcookie": 212, "vhangup": 153, "sethostname": 170,
    "setdomainname": 171, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "iopl": 172, "ioperm": 173,
    "modify_ldt": 154, "keyctl": 250, "add_key": 248, "request_key": 249,
    "clone": 56, "clone3": 435, "personality": 135, "socket": 41,
}  # fmt: skip
_AARCH64 = {
    "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
    "pidfd_getfd": 438, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
    "unshare": 97, "setns": 268, "move_mount": 429, "open_tree": 428, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "init_module": 105,
    "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294,
    "reboot": 142, "swapon": 224, "swapoff": 225, "settimeofday": 170, "clock_settime": 112,
    "clock_adjtime": 266, "adjtimex": 171, "acct": 89, "syslog": 116, "quotactl": 60,
    "quotactl_fd": 443, "lookup_dcookie": 18, "vhangup": 58, "sethostname": 161,
    "setdomainname": 162, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
    "open_by_handle_at": 265, "name_to_handle_at": 264, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 219, "add_key": 217,
    "request_key": 218, "clone": 220, "clone3": 435, "personality": 92, "socket": 198,
}  # fmt: skip
# machine -> (AUDIT_ARCH_*, table, the x32 bit that must not be set, or 0)
_ARCHES = {
    "x86_64": (0xC000003E, _X86_64, 0x40000000),
    "aarch64": (0xC00000B7, _AARCH64, 0),
}


def supported() -> bool:
    """Whether this machine's architecture has a filter."""
    return platform.machine() in _ARCHES


@functools.cache
def program() -> bytes:
    """The filter as the ``struct sock_filter`` array bwrap's ``--seccomp FD`` reads."""
    machine = platform.machine()
    if machine not in _ARCHES:
        raise EngineUnavailable(
            f"the bwrap tier's seccomp filter has no syscall table for {machine} (x86_64, aarch64)"
        )
    audit_arch, table, x32 = _ARCHES[machine]
    denied = sorted({table[name] for name in DENIED if name in table})
    # Instructions with symbolic jump targets (labels), resolved to forward offsets at the end.
    code: list[tuple[int, int | str, int | str, int]] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 0, "kill", audit_arch),
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if x32:
        code.append((_JGE_K, "kill", 0, x32))
    code += [(_JEQ_K, "eperm", 0, nr) for nr in denied]
    code += [
        (_JEQ_K, "enosys", 0, table["clone3"]),
        (_JEQ_K, "clone", 0, table["clone"]),
        (_JEQ_K, "personality", 0, table["personality"]),
        (_JEQ_K, "socket", 0, table["socket"]),
    ]
    labels: dict[str, int] = {}

    def label(name: str) -> None:
        labels[name] = len(code)

    code.append((_RET_K, 0, 0, _ALLOW))  # no check matched
    # Classic BPF jumps forward only: each argument check below ends in "pass" or "eperm".
    label("clone")  # a namespace flag in its flags: EPERM
    code += [(_LD_W_ABS, 0, 0, _ARG0), (_JSET_K, "eperm", "pass", _NAMESPACE_FLAGS)]
    label("personality")  # only the personas Docker's default profile allows (and the query)
    code.append((_LD_W_ABS, 0, 0, _ARG0))
    code += [(_JEQ_K, "pass", 0, persona) for persona in PERSONAS]
    code.append((_JEQ_K, "eperm", "eperm", 0))
    label("socket")  # vsock reaches the host (or a VM) past every network namespace
    code += [(_LD_W_ABS, 0, 0, _ARG0), (_JEQ_K, "eperm", "pass", AF_VSOCK)]
    label("pass")
    code.append((_RET_K, 0, 0, _ALLOW))
    label("eperm")
    code.append((_RET_K, 0, 0, _ERRNO | errno.EPERM))
    label("enosys")
    code.append((_RET_K, 0, 0, _ERRNO | errno.ENOSYS))
    label("kill")
    code.append((_RET_K, 0, 0, _KILL_PROCESS))

    def offset(at: int, target: int | str) -> int:
        if isinstance(target, int):
            return target
        jump = labels[target] - (at + 1)
        if not 0 <= jump <= 255:
            raise AssertionError("seccomp filter too long for a short jump")
        return jump

    return b"".join(
        struct.pack("=HBBI", op, offset(at, jt), offset(at, jf), k)
        for at, (op, jt, jf, k) in enumerate(code)
    )
