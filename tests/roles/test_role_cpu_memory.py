"""``train.cpu_memory``: ``keep`` stops freed tensor memory going back to the kernel (the next
allocation reuses it without page faults), ``release`` restores glibc's starting thresholds,
``auto`` keeps on glibc, and an explicit choice without glibc is refused.

mallopt is process-wide, so the measurements run in a child process each and this test
process's allocator is left as it was."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from polyrl.roles import cpu_memory
from polyrl.roles.cpu_memory import CpuMemoryError, resolve_cpu_memory

needs_glibc = pytest.mark.skipif(not cpu_memory.glibc_available(), reason="mallopt is glibc's")

# A learner's pattern: a micro-batch's activations (here 16 tensors of 6 MiB, the size of one
# [16, 63, 1536] fp32 activation) are alive together, then all freed after the backward, then
# allocated again for the next micro-batch. The child applies the setting, runs one such round
# untimed, then reports the minor page faults of the next 10 rounds.
_CHILD = """
import json, resource, sys
import torch
from polyrl.roles.cpu_memory import apply_cpu_memory
if sys.argv[1] != "none":
    apply_cpu_memory(sys.argv[1])
def micro_batch():
    alive = [torch.empty(1536 * 1024).fill_(1.0) for _ in range(16)]
    del alive
micro_batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    micro_batch()
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before))
"""


def _faults(choice: str) -> int:
    done = subprocess.run([sys.executable, "-c", _CHILD, choice], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_glibc
def test_keep_reuses_freed_memory_without_page_faults_and_release_does_not():
    kept, released, untouched = _faults("keep"), _faults("release"), _faults("none")
    pages = 10 * 16 * (6 * 2**20 // 4096)  # 10 rounds × 16 tensors × 1,536 pages of 4 KiB = 245,760
    # release: glibc's starting thresholds, every 6 MiB block is a fresh mmap: every page faults.
    assert released > 0.9 * pages, (released, pages)
    # glibc untouched adapts its mmap threshold to 6 MiB after the first free, but then trims
    # the heap's free top after each round (seen here: ~14 of the 16 tensors fault every round).
    assert untouched > 0.5 * pages, (untouched, pages)
    # keep: the heap is neither trimmed nor bypassed; a stray round may still fault (seen: up to
    # 7 tensors once), never a tenth of the pages.
    assert kept < 0.1 * pages, (kept, pages)


def test_the_choice_follows_its_rule(monkeypatch):
    monkeypatch.setattr(cpu_memory, "glibc_available", lambda: True)
    assert resolve_cpu_memory("auto") == "keep"
    assert resolve_cpu_memory("keep") == "keep"
    assert resolve_cpu_memory("release") == "release"
    monkeypatch.setattr(cpu_memory, "glibc_available", lambda: False)
    assert resolve_cpu_memory("auto") == "default"  # not glibc: nothing to set, nothing claimed
    for explicit in ("keep", "release"):
        with pytest.raises(CpuMemoryError, match=f"train.cpu_memory: {explicit} needs glibc"):
            resolve_cpu_memory(explicit)


def test_a_setting_outside_the_allowed_values_is_refused_with_its_field():
    from polyrl.config.schema import ConfigError, resolve_arms

    with pytest.raises(ConfigError) as error:
        resolve_arms({"name": "x", "train": {"cpu_memory": "hoard"}})
    message = str(error.value)
    assert "train.cpu_memory" in message and "'auto', 'keep' or 'release'" in message
