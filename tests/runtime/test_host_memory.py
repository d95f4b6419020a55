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
