"""Comparison statistics on hand-made metric histories with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polyrl.launch.stats import (bootstrap_interval, curve_band, interquartile_mean, mean_interval, verdict,
                                   welch_difference)


def test_mean_interval_is_student_t():
    # [1, 2, 3]: mean 2, s = 1 (ddof 1), sem = 1/√3 = 0.577350; t_{0.975, df=2} = 4.302653
    # half-width = 4.302653 × 0.577350 = 2.484138 → (−0.484138, 4.484138)
    interval = mean_interval([1.0, 2.0, 3.0])
    assert interval.estimate == pytest.approx(2.0, abs=1e-12)
    assert interval.low == pytest.approx(-0.484138, abs=1e-6)
    assert interval.high == pytest.approx(4.484138, abs=1e-6)
    assert interval.n == 3


def test_mean_interval_edge_cases():
    assert math.isnan(mean_interval([]).estimate)
    single = mean_interval([0.5])
    assert single.estimate == 0.5 and math.isnan(single.low)
    constant = mean_interval([0.25, 0.25, 0.25])
    assert (constant.low, constant.high) == (0.25, 0.25)
    # Non-finite values (a NaN metric of a failed seed) are left out, not averaged.
    assert mean_interval([1.0, math.nan, 3.0]).estimate == pytest.approx(2.0)


def test_welch_difference_by_hand():
    # a = [1,2,3], b = [4,5,6]: diff = −3; var_a = var_b = 1, n = 3 → se = √(1/3 + 1/3) = 0.816497
    # Welch df = (2/3)² / ((1/3)²/2 + (1/3)²/2) = (4/9)/(1/9) = 4; t_{0.975, 4} = 2.776445
    # half-width = 2.776445 × 0.816497 = 2.266958 → (−5.266958, −0.733042)
    difference = welch_difference([1, 2, 3], [4, 5, 6])
    assert difference.estimate == pytest.approx(-3.0)
    assert difference.low == pytest.approx(-5.266958, abs=1e-6)
    assert difference.high == pytest.approx(-0.733042, abs=1e-6)
    assert "b" in verdict(difference, names=("a", "b")) and "excludes 0" in verdict(difference, names=("a", "b"))


def test_welch_unequal_variances():
    # a = [0, 2] (var 2), b = [0, 0, 0, 4] (var 4): diff = 1 − 1 = 0
    # se² = 2/2 + 4/4 = 2; df = 2² / (1²/1 + 1²/3) = 4 / (4/3) = 3; t_{0.975,3} = 3.182446
    # half-width = 3.182446 × 1.414214 = 4.500659
    difference = welch_difference([0, 2], [0, 0, 0, 4])
    assert difference.estimate == pytest.approx(0.0, abs=1e-12)
    assert difference.half_width == pytest.approx(4.500659, abs=1e-6)
    assert "not distinguishable" in verdict(difference, names=("grpo", "dr_grpo"))


def test_interquartile_mean():
    # 8 values, 25% trimmed from each end (2 each): middle [3, 4, 5, 6] → 4.5; the outlier 100 is gone.
    assert interquartile_mean([100, 1, 2, 3, 4, 5, 6, 7]) == pytest.approx(4.5)


def test_bootstrap_interval_covers_the_mean_and_is_reproducible():
    values = np.arange(10, dtype=float)  # mean 4.5
    first = bootstrap_interval(values, seed=1)
    again = bootstrap_interval(values, seed=1)
    assert first.estimate == pytest.approx(4.5)
    assert first.low < 4.5 < first.high
    assert (first.low, first.high) == (again.low, again.high)


def test_curve_band_per_step():
    # Seed A logs steps 1, 2; seed B logs 1, 2, 3. Step 1: [0, 2] → mean 1, s = √2, sem = 1,
    # t_{0.975,1} = 12.706205 → (1 − 12.706205, 1 + 12.706205). Step 3: one value → band = value.
    steps, mean, low, high = curve_band([[(1, 0.0), (2, 1.0)], [(1, 2.0), (2, 1.0), (3, 5.0)]])
    assert steps == [1, 2, 3]
    assert mean == pytest.approx([1.0, 1.0, 5.0])
    assert low[0] == pytest.approx(1 - 12.706205, abs=1e-5) and high[0] == pytest.approx(1 + 12.706205, abs=1e-5)
    assert (low[1], high[1]) == (1.0, 1.0)  # no spread at step 2
    assert (low[2], high[2]) == (5.0, 5.0)
