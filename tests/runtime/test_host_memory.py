"""``keep_freed_host_memory``: afterwards, an update-like pattern of activation-sized blocks,
allocated and freed step after step, reuses its memory without the kernel faulting pages in.

Each case runs in a fresh interpreter: the setting is process-wide. Both start from glibc's
initial mmap threshold (128 KiB) pinned, so that the baseline does not depend on the history of
glibc's dynamic threshold (which moves with every free of a mapped block)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from polyrl.runtime.host_memory import keep_freed_host_memory

PROBE = """
import ctypes, json, resource, sys, torch
from polyrl.runtime.host_memory import M_MMAP_THRESHOLD, keep_freed_host_memory

ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 128 * 1024)
done = keep_freed_host_memory() if sys.argv[1] == "keep" else "default"

def step():  # activations of a few sizes (1-12 MiB), alive together, then freed
    blocks = [torch.ones(n) for n in (2**18, 2**20, 3 * 2**20, 2**19, 2**21)]
    del blocks

for _ in range(5):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(json.dumps({"faults_per_step": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10, "done": done}))
"""


def _probe(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not keep_freed_host_memory().startswith("glibc"), reason="glibc's mallopt only")
def test_freed_blocks_are_reused_without_page_faults():
    pages_per_step = (2**18 + 2**20 + 3 * 2**20 + 2**19 + 2**21) * 4 // 4096  # 7,424 pages of 4 KiB
    default, kept = _probe("default"), _probe("keep")
    assert default["faults_per_step"] > pages_per_step * 0.9, default  # every block mapped afresh, every step
    assert kept["faults_per_step"] < pages_per_step * 0.05, kept  # the same blocks reused from the heap (seen: 0-205)
    assert kept["done"].startswith("glibc") and "freed memory kept" in kept["done"]


TRIM_PROBE = """
import json, os, torch
from polyrl.runtime.host_memory import keep_freed_host_memory, release_freed_host_memory

def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

keep_freed_host_memory()
blocks = [torch.ones(2**20) for _ in range(64)]  # 64 x 4 MiB in the heap (under the 32 MiB mmap threshold)
held = rss()
last = blocks[-1]  # the heap's top stays in use: freeing the rest leaves holes no automatic trim reaches
del blocks
kept = rss()
released = release_freed_host_memory()
print(json.dumps({"held": held, "kept": kept, "after": rss(), "released": released}))
"""


@pytest.mark.skipif(not keep_freed_host_memory().startswith("glibc"), reason="glibc's malloc_trim only")
def test_release_hands_freed_heap_pages_back_to_the_kernel():
    done = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, timeout=120, check=True)
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    freed = 63 * 4 * 2**20  # 252 MiB of blocks freed below the one still in use
    assert probe["held"] - probe["kept"] < 0.1 * freed, probe  # glibc kept them resident
    assert probe["kept"] - probe["after"] > 0.9 * freed, probe  # malloc_trim gave their pages back
    assert probe["released"] is True
