"""models/cache.py: the key and record helpers the three warm-ups share."""

import hashlib
import json
import time

from polyrl.policies.cache import build_record, cache_key, held_out_examples


def test_cache_key_names_size_seed_and_hashes_every_setting():
    settings = {"size": "0.3m", "seed": 3, "lr": 0.002}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    assert cache_key("draw", settings) == f"draw-0.3m-s3-{digest}"
    assert cache_key("draw", {**settings, "lr": 0.001}) != cache_key("draw", settings)


def test_build_record_starts_with_settings_key_size_and_timings():
    record = build_record({"size": "0.3m", "seed": 0}, key="k", params=12, started=time.perf_counter() - 2.0, train_seconds=1.234)
    assert list(record)[:6] == ["size", "seed", "key", "params", "train_seconds", "total_seconds"]
    assert record["train_seconds"] == 1.23 and record["params"] == 12
    assert 2.0 <= record["total_seconds"] < 60.0


def test_held_out_examples_pairs_rows_with_both_completions_and_stops_at_count():
    rows = [{"prompt": f"p{i}", "answer": f"a{i}", "other": 0} for i in range(10)]
    examples = held_out_examples(rows, [f"g{i}" for i in range(10)], [f"s{i}" for i in range(10)], count=2)
    assert examples == [
        {"prompt": "p0", "answer": "a0", "greedy": "g0", "sampled": "s0"},
        {"prompt": "p1", "answer": "a1", "greedy": "g1", "sampled": "s1"},
    ]
