"""tasks/common.py: the shipped-splits plumbing both synthetic tasks share."""

from __future__ import annotations

import hashlib

import pytest

from polyrl.tasks import arithmetic, drawing
from polyrl.tasks.common import ShippedSplits, hashed_split


def _rows(n: int, *, seed: int, split: str) -> list[dict]:
    return [{"id": f"{split}-{seed}-{i}"} for i in range(n)]


def test_shipped_splits_write_read_and_version_round_trip(tmp_path):
    shipped = ShippedSplits(tmp_path / "data", {"train": 3, "test": 1}, 7, _rows)
    paths = shipped.write()
    assert paths == {"train": tmp_path / "data" / "train.jsonl", "test": tmp_path / "data" / "test.jsonl"}
    assert shipped.read("train") == [{"id": "train-7-0"}, {"id": "train-7-1"}, {"id": "train-7-2"}]
    assert shipped.read("test") == [{"id": "test-7-0"}]
    # The version hashes train then test: a change to either file changes it.
    expected = hashlib.sha256(paths["train"].read_bytes() + paths["test"].read_bytes()).hexdigest()[:16]
    assert shipped.version() == expected
    with pytest.raises(ValueError, match=r"unknown split 'dev'; allowed: \['train', 'test'\]"):
        shipped.path("dev")


def test_both_tasks_ship_exactly_what_their_generator_writes(tmp_path):
    for task, shipped in ((arithmetic, arithmetic.SHIPPED), (drawing, drawing.SHIPPED)):
        written = shipped.write(tmp_path / task.__name__)
        for split, path in written.items():
            assert path.read_bytes() == task.shipped_path(split).read_bytes(), (task.__name__, split)


def test_hashed_split_is_one_bucket_in_n():
    # 1/8 = 0.125 of the keys are test; binomial sd over 4000 keys is sqrt(.125*.875/4000) = 0.0052.
    keys = [f"key-{i}" for i in range(4000)]
    share = sum(hashed_split(k, 8) == "test" for k in keys) / len(keys)
    assert 0.10 < share < 0.15
    assert arithmetic.problem_split("Q: 1+1=? A:") == hashed_split("Q: 1+1=? A:", arithmetic.TEST_BUCKETS)
