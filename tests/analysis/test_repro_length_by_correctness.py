"""scripts/repro_length_by_correctness.py: lengths of wrong and right answers from a sample table."""

from __future__ import annotations

import math

import pytest

from tests.analysis.script_modules import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("repro_length_by_correctness")


def test_table_summary_by_hand(script):
    columns = ["prompt", "completion", "reward", "length", "finish_reason"]
    data = [
        ["Q: 8+4=? A:", " #### 12", 1.0, 9, "stop"],
        ["Q: 8+4=? A:", " #### 13", 0.0, 9, "stop"],
        ["Q: 8+4=? A:", " work: 8+4=12. #### 12", 1.0, 23, "stop"],
        ["Q: 8+4=? A:", " work: 8+4=11. #### 11", 0.0, 23, "stop"],
        ["Q: 8+4=? A:", " work: 8+4=1", 0.0, 40, "length"],
        ["Q: 8+4=? A:", " #### 12", None, 9, "stop"],  # unscored: left out everywhere
    ]
    out = script.table_summary(columns, data)
    # wrong: lengths 9, 23, 40 -> 72 / 3 = 24; right: 9, 23 -> 32 / 2 = 16
    assert out["wrong length"] == pytest.approx(24.0, abs=1e-12)
    assert out["right length"] == pytest.approx(16.0, abs=1e-12)
    # long ("work:") among the 5 scored: rows 3, 4, 5 -> 3/5; among the 3 wrong: rows 4, 5 -> 2/3
    assert out["long share"] == pytest.approx(0.6, abs=1e-12)
    assert out["wrong long share"] == pytest.approx(2 / 3, abs=1e-12)


def test_table_summary_without_right_answers_is_nan(script):
    out = script.table_summary(["completion", "reward", "length"], [[" #### 1", 0.0, 8]])
    assert out["wrong length"] == 8.0 and math.isnan(out["right length"])


def test_first_and_late_averages_the_last_tables_skipping_nan(script):
    def summary(wrong, right):
        return {"wrong length": wrong, "right length": right, "long share": 0.5, "wrong long share": 0.25}

    per_step = {10: summary(20.0, 30.0), 5: summary(10.0, math.nan), 15: summary(26.0, math.nan), 1: summary(8.0, 9.0)}
    first, late = script.first_and_late(per_step, last=3)
    # first = step 1; last 3 steps are 5, 10, 15: wrong (10 + 20 + 26) / 3 = 56 / 3; right: only 30 is finite
    assert first["wrong length"] == 8.0
    assert late["wrong length"] == pytest.approx(56 / 3, abs=1e-12)
    assert late["right length"] == pytest.approx(30.0, abs=1e-12)
