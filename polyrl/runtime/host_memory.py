"""Keep freed host memory in the process, so that a CPU learner's activations stop faulting in.

glibc's ``malloc`` serves every block above its mmap threshold (dynamic, at most 32 MiB) with a
fresh ``mmap`` and unmaps it on ``free``; above its trim threshold it hands the top of the heap
back to the kernel. An RL update frees and re-allocates the same activation sizes every
micro-batch, so each step touches its pages for the first time again: ~53,000 minor page faults
per 30m update on the 2-core AMD EPYC machine. There, one transposing copy of a gate/up gradient
([1536, 1216], 7.5 MB) inside oneDNN's weight-gradient product took 15.7 ms in a profile of the
update, against ~1.7 ms on memory already mapped.

Raising both thresholds (``mallopt``; the effect of ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=
…:glibc.malloc.trim_threshold=…``) keeps freed blocks in the heap for the next micro-batch. On
that machine, 30m policy, Dr.GRPO, 8 × 8 samples, whole RL steps with vLLM (median of 6 steps per
process, processes alternating with and without):

* ≤ 64 new tokens, three pairs: update ×1.01, ×1.08, ×1.03; step ×1.01, ×1.07, ×1.00; faults per
  step 19-52k → 5-15k (glibc's default moves with its dynamic threshold's history);
* 192 new tokens, one pair: update ×1.13 (7.15 → 6.32 s), generation ×1.08, step ×1.10; faults
  per step 145k → 12k.

A 5th-gen Intel Xeon showed no change beyond its noise (stop 17 of this project, 4 pairs).

Freed memory that the next phase cannot reuse is handed back (:func:`release_freed_host_memory`,
glibc's ``malloc_trim``): before each update and before the weight sync. Measured on SmolLM2-135M
(fp32, full fine-tuning, 8 × 8 samples, vLLM in-process, ``bench/compare_trl.py --trace-rss``,
glibc's ``mallinfo2``): glibc held 1.3 GiB of free chunks when the second update began and
2.6 GiB after it, resident, that the update did not reuse: chunks freed by generation and by the
previous update, of other sizes. Handing back whole free pages keeps the chunks for reuse (a
reuse faults its pages in again).

A third trim, after each mini-batch's first backward (to hand back the holes it leaves among the
activations), was removed: in one interleaved ``compare_trl`` round on the 2-core AMD EPYC
(2026-12-03, fp32 full cell) the update took 37.3 s with it against 26.3 s without, for the same
peak RSS (5905 vs 5892 MiB): the next micro-batches faulted the pages in again. Without any trim
the step was 32.3 s (update 23.9 s) with a peak of 6188 MiB, so the two that stay cost ~10% of
the step for ~0.3 GiB less peak.
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
