"""Freed tensor memory kept in the process for reuse (``train.cpu_memory``).

Why: torch's CPU tensors come from glibc ``malloc``. glibc serves a block of 128 KiB or more
(its starting ``mmap`` threshold) with a fresh ``mmap`` and hands it back to the kernel when it
is freed, and it trims the top of its heap whenever 128 KiB lie free there. A learner's
micro-batch allocates activations of several MiB each ([16 rows, 63 positions, 1536] fp32 is
6 MiB), frees them after the backward, and allocates them again for the next micro-batch, so
every micro-batch touches fresh pages and takes a page fault per 4 KiB page: ~130,000 minor faults
per 30m update here. In a virtual machine a fault costs microseconds (the hypervisor maps the
page too), which showed in the profile as element-wise kernels running 3–7× slower inside the
update than alone (a [16, 57, 1536] multiply: 3.3 ms in the update, 0.48 ms alone).

What ``keep`` does: ``mallopt(M_MMAP_THRESHOLD, 32 MiB)`` (glibc's largest) so that blocks up
to 32 MiB come from the heap, and ``mallopt(M_TRIM_THRESHOLD, 2 GiB)`` so the heap is not
handed back; freed blocks are reused by the next micro-batch without faults (~300 faults per
update). The cost: the process keeps its peak resident memory instead of returning it between
updates, as a GPU caching allocator does. Blocks over 32 MiB still come from ``mmap``. It is
process-wide, so it applies to everything in the learner's process (a vLLM engine in the same
process included). This is what the tcmalloc preload vLLM's CPU guide recommends buys, without
a preload: ``mallopt`` takes effect at once, in a running process.

``release`` sets glibc's own starting values (128 KiB each) back; glibc's dynamic adjustment of
the ``mmap`` threshold stays off once ``mallopt`` has been called, so ``release`` after ``keep``
in one process is glibc's start-up behaviour, not its adapted one. ``auto`` keeps where the C
library is glibc (Linux) and leaves anything else alone; an explicit ``keep`` or ``release``
where the C library is not glibc is refused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

from polyrl.core.errors import PolyrlError

__all__ = ["CpuMemoryError", "apply_cpu_memory", "glibc_available", "resolve_cpu_memory"]

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# The largest mmap threshold glibc accepts on a 64-bit system (DEFAULT_MMAP_THRESHOLD_MAX).
KEEP_MMAP_THRESHOLD = 32 * 1024 * 1024
KEEP_TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: 2 GiB free at the heap's top before any goes back
GLIBC_DEFAULT_THRESHOLD = 128 * 1024


class CpuMemoryError(PolyrlError):
    """``train.cpu_memory`` cannot apply in this process."""


def _libc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") else None


def glibc_available() -> bool:
    return _libc() is not None


def resolve_cpu_memory(setting: str) -> str:
    """``keep``, ``release`` or ``default`` (nothing done: not glibc) for ``train.cpu_memory``."""
    if glibc_available():
        return "keep" if setting == "auto" else setting
    if setting == "auto":
        return "default"
    raise CpuMemoryError(f"train.cpu_memory: {setting} needs glibc's malloc (Linux); this process's C library is "
                         f"{platform.libc_ver()[0] or 'unknown'}. Use auto.")


def apply_cpu_memory(choice: str) -> None:
    """Sets glibc's thresholds for ``choice`` (from :func:`resolve_cpu_memory`); ``default`` does nothing."""
    if choice == "default":
        return
    libc = _libc()
    if libc is None:
        raise CpuMemoryError(f"train.cpu_memory: {choice} needs glibc's malloc (Linux)")
    mmap_threshold, trim_threshold = ((KEEP_MMAP_THRESHOLD, KEEP_TRIM_THRESHOLD) if choice == "keep"
                                      else (GLIBC_DEFAULT_THRESHOLD, GLIBC_DEFAULT_THRESHOLD))
    for parameter, value in ((_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, trim_threshold)):
        if libc.mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) != 1:
            raise CpuMemoryError(f"train.cpu_memory: glibc refused mallopt({parameter}, {value})")
