"""Keep freed host memory in the process, so that a CPU learner's activations stop faulting in.

glibc's ``malloc`` serves every block above its mmap threshold (dynamic, at most 32 MiB) with a
fresh ``mmap`` and unmaps it on ``free``; above its trim threshold it hands the top of the heap
back to the kernel. An RL update frees and re-allocates the same activation sizes every
micro-batch, so each step touches its pages for the first time again: tens of thousands of
minor page faults per update, and in a profile copies into freshly mapped memory ran several
times slower than on memory already mapped (docs/benchmarks.md).

Raising both thresholds (``mallopt``; the effect of ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=
…:glibc.malloc.trim_threshold=…``) keeps freed blocks in the heap for the next micro-batch. On
the AMD EPYC machine that made whole RL steps faster and cut their page faults by an order of
magnitude; a 5th-gen Intel Xeon showed no change beyond its noise (docs/benchmarks.md).

Freed memory that the next phase cannot reuse is handed back (:func:`release_freed_host_memory`,
glibc's ``malloc_trim``): before each update and before the weight sync. A trace on SmolLM2-135M
(``bench/compare_trl.py --trace-rss``, glibc's ``mallinfo2``) showed glibc holding gigabytes of
free chunks, resident, that the update did not reuse: chunks freed by generation and by the
previous update, of other sizes (docs/benchmarks.md, "Where the memory went"). Handing back whole free pages keeps the chunks for reuse (a
reuse faults its pages in again).

A third trim, after each mini-batch's first backward (to hand back the holes it leaves among the
activations), was removed: in an interleaved ``compare_trl`` A/B it slowed the update for the same
peak RSS, because the next micro-batches faulted the pages in again; the two trims that stay cost
a little step time for a lower peak (the A/B: docs/benchmarks.md, "Where the memory went").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["keep_freed_host_memory", "release_freed_host_memory"]

# glibc's <malloc.h> parameter numbers.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit): larger blocks still get their own mmap
TRIM_THRESHOLD_BYTES = 2**31 - 1  # an int: free memory at the top of the heap stays up to ~2 GiB


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc, not musl/macOS
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def release_freed_host_memory() -> bool:
    """Hand the whole free pages of every glibc arena back to the kernel (``malloc_trim(0)``);
    the chunks stay free for reuse (a reuse faults its pages in again). Returns whether glibc
    released anything; False where the allocator is not glibc's."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


@functools.cache  # process-wide, once
def keep_freed_host_memory() -> str:
    """Raise glibc's mmap and trim thresholds; returns what was done, for the run's params."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return "unchanged: not glibc"
    version.restype = ctypes.c_char_p
    if not (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
        return f"unchanged: glibc {version().decode()} refused mallopt"
    return f"glibc {version().decode()}: freed memory kept (mmap threshold 32 MiB, trim threshold 2 GiB)"
