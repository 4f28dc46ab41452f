"""The system calls a bubblewrap sandbox may not make, as a seccomp filter bwrap installs (``--seccomp FD``).

Refused with EPERM: new namespaces (``unshare``, ``setns``, ``clone`` with a namespace flag, so no
nested user namespace and the capabilities it would grant), mounting (the old and the new mount
API), ``ptrace`` and reading or writing another process's memory, kexec, ``bpf``, the kernel keyring
(``keyctl``, ``add_key``, ``request_key``), ``perf_event_open`` and kernel modules. ``clone3`` gets
ENOSYS: its flags sit in memory a filter cannot read, and on ENOSYS the C library falls back to
``clone``, whose flags the filter checks. A call made with another architecture's numbering
(32-bit ``int 0x80`` on x86-64, x32) is refused whatever it is, so it cannot slip past by number.

The program is classic BPF, written out here for x86-64 and aarch64 (no libseccomp needed); the
tests check its numbers against libseccomp's tables and run it on sample calls.
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import struct
from dataclasses import dataclass

REFUSED = (
    "unshare", "setns",
    "mount", "umount2", "pivot_root",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "ptrace", "process_vm_readv", "process_vm_writev",
    "kexec_load", "kexec_file_load",
    "bpf", "keyctl", "add_key", "request_key", "perf_event_open",
    "init_module", "finit_module", "delete_module",
)  # fmt: skip
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET (clone's low byte is the exit signal).
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
X32_SYSCALL_BIT = 0x40000000


@dataclass(frozen=True)
class Arch:
    name: str
    audit_arch: int  # AUDIT_ARCH_* of <linux/audit.h>, the ``arch`` field of seccomp_data
    numbers: dict[str, int]  # system call numbers of REFUSED, plus clone and clone3
    has_x32: bool = False


ARCHES = {
    "x86_64": Arch("x86_64", 0xC000003E, {
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "kexec_load": 246, "kexec_file_load": 320, "bpf": 321, "keyctl": 250, "add_key": 248, "request_key": 249,
        "perf_event_open": 298, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "clone": 56, "clone3": 435,
    }, has_x32=True),
    "aarch64": Arch("aarch64", 0xC00000B7, {
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "kexec_load": 104, "kexec_file_load": 294, "bpf": 280, "keyctl": 219, "add_key": 217, "request_key": 218,
        "perf_event_open": 241, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "clone": 220, "clone3": 435,
    }),
}  # fmt: skip
MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}

# Classic BPF opcodes (<linux/filter.h>) and seccomp return values (<linux/seccomp.h>).
LD_W_ABS = 0x20
JEQ_K, JGE_K, JSET_K = 0x15, 0x35, 0x45
RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
NR_OFFSET, ARCH_OFFSET, ARG0_LOW_OFFSET = 0, 4, 16  # in struct seccomp_data (little-endian)
INSTRUCTION = struct.Struct("=HBBI")  # struct sock_filter


def native_arch() -> Arch | None:
    """The filter's architecture for this host, None where none is written out."""
    machine = platform.machine()
    return ARCHES.get(MACHINE_ALIASES.get(machine, machine))


@functools.cache
def filter_program(arch_name: str) -> bytes:
    """The filter for ``arch_name`` as bwrap reads it: an array of ``struct sock_filter``."""
    arch = ARCHES[arch_name]
    code: list[tuple[int, str | None, str | None, int]] = []  # (opcode, jump if true, jump if false, k)
    labels: dict[str, int] = {}

    def emit(opcode: int, k: int, true: str | None = None, false: str | None = None) -> None:
        code.append((opcode, true, false, k))

    emit(LD_W_ABS, ARCH_OFFSET)
    emit(JEQ_K, arch.audit_arch, false="deny")
    emit(LD_W_ABS, NR_OFFSET)
    if arch.has_x32:
        emit(JGE_K, X32_SYSCALL_BIT, true="deny")
    for name in REFUSED:
        emit(JEQ_K, arch.numbers[name], true="deny")
    emit(JEQ_K, arch.numbers["clone3"], true="enosys")
    emit(JEQ_K, arch.numbers["clone"], false="allow")
    emit(LD_W_ABS, ARG0_LOW_OFFSET)
    emit(JSET_K, CLONE_NAMESPACE_FLAGS, true="deny")
    for label, value in (("allow", RET_ALLOW), ("deny", RET_ERRNO | errno.EPERM), ("enosys", RET_ERRNO | errno.ENOSYS)):
        labels[label] = len(code)
        emit(RET_K, value)

    def offset(at: int, label: str | None) -> int:
        return 0 if label is None else labels[label] - at - 1

    return b"".join(INSTRUCTION.pack(op, offset(i, t), offset(i, f), k) for i, (op, t, f, k) in enumerate(code))


def program_fd(arch: Arch) -> int:
    """A descriptor that reads the filter from its start, to pass to bwrap's ``--seccomp``."""
    fd = os.memfd_create("posttrain-seccomp")
    os.write(fd, filter_program(arch.name))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
