"""The kernel's rules for a tool call's child (:mod:`polyrl.envs.sandbox_worker`): a seccomp filter.

Installed in the child after its limits are set, it refuses, for root too:

- new processes: ``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD`` (threads still work),
  ``clone3`` (its flags sit behind a pointer a filter cannot read; ``ENOSYS`` makes libc fall back
  to ``clone``), ``execve`` and ``execveat``;
- lifting the limits: ``setrlimit``, and ``prlimit64`` but for reading the child's own limits
  (root could otherwise raise a hard limit);
- touching other processes: ``kill`` but of the child itself or its own group, ``tgkill`` and
  ``rt_tgsigqueueinfo`` but within the child, ``tkill``, ``rt_sigqueueinfo``,
  ``pidfd_send_signal``, ``ptrace``, ``process_vm_readv`` and ``process_vm_writev``;
- another ABI's system calls (x86's ``int 0x80``, x32).

Tables for x86-64 and aarch64; elsewhere :func:`seccomp_program` is None and the worker falls
back to ``RLIMIT_NPROC``. Standard library only. ``struct seccomp_data``: nr at 0, arch at 4,
args[i] at 16 + 8 i (low 32 bits first: little-endian).
"""

from __future__ import annotations

import ctypes
import os
import struct

__all__ = ["install_seccomp", "seccomp_program"]

_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, JMP|JSET|K, RET|K
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _EAGAIN, _ENOSYS = 1, 11, 38
_CLONE_THREAD = 0x00010000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Syscall numbers (None: not in this ABI).
_NUMBERS = {
    "x86_64": {
        "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "execve": 59, "execveat": 322, "setrlimit": 160,
        "prlimit64": 302, "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
        "pidfd_send_signal": 424, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    },
    "aarch64": {
        "fork": None, "vfork": None, "clone": 220, "clone3": 435, "execve": 221, "execveat": 281, "setrlimit": 164,
        "prlimit64": 261, "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
        "pidfd_send_signal": 424, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
    },
}  # fmt: skip
_REFUSED = {
    "fork": _EAGAIN, "vfork": _EAGAIN, "clone3": _ENOSYS, "execve": _EPERM, "execveat": _EPERM, "setrlimit": _EPERM,
    "tkill": _EPERM, "rt_sigqueueinfo": _EPERM, "pidfd_send_signal": _EPERM, "ptrace": _EPERM,
    "process_vm_readv": _EPERM, "process_vm_writev": _EPERM,
}  # fmt: skip


def _op(code: int, k: int, jump_true: int = 0, jump_false: int = 0) -> bytes:
    return struct.pack("HBBI", code, jump_true, jump_false, k)


def _when(number: int | None, body: list[bytes]) -> list[bytes]:
    """``body`` (which ends in returns) for syscall ``number``; the next rule otherwise."""
    return [] if number is None else [_op(_JEQ, number, 0, len(body)), *body]


def seccomp_program(pid: int) -> bytes | None:
    """The filter for the child ``pid`` (see the module docstring), or None without a table."""
    machine = os.uname().machine
    if machine not in _NUMBERS:
        return None
    n = _NUMBERS[machine]
    own, own_group = pid & 0xFFFFFFFF, -pid & 0xFFFFFFFF
    program = [
        _op(_LD, 4),
        _op(_JEQ, _ARCH[machine], 1, 0),
        _op(_RET, _ERRNO | _ENOSYS),  # another ABI
        _op(_LD, 0),
        _op(_JGE, 0x40000000, 0, 1),
        _op(_RET, _ERRNO | _ENOSYS),  # the x32 ABI
    ]
    for name, errno in _REFUSED.items():
        program += _when(n[name], [_op(_RET, _ERRNO | errno)])
    allow, refuse = _op(_RET, _ALLOW), _op(_RET, _ERRNO | _EPERM)
    # kill(pid): this process (pid), its group (0 or -pid); a thread's signal: this process.
    program += _when(n["kill"], [_op(_LD, 16), _op(_JEQ, own, 3), _op(_JEQ, 0, 2), _op(_JEQ, own_group, 1), refuse, allow])
    for name in ("tgkill", "rt_tgsigqueueinfo"):
        program += _when(n[name], [_op(_LD, 16), _op(_JEQ, own, 1), refuse, allow])
    # prlimit64(0, resource, NULL, old): reading this process's limits only.
    program += _when(n["prlimit64"], [
        _op(_LD, 16), _op(_JEQ, 0, 0, 4), _op(_LD, 32), _op(_JEQ, 0, 0, 2), _op(_LD, 36), _op(_JEQ, 0, 1, 0), refuse, allow,
    ])  # fmt: skip
    program += _when(n["clone"], [_op(_LD, 16), _op(_JSET, _CLONE_THREAD, 1, 0), _op(_RET, _ERRNO | _EAGAIN), allow])
    program.append(allow)
    return b"".join(program)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program: bytes | None) -> bool:
    """Install ``program`` on this process (irreversibly); whether it took."""
    if program is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0
