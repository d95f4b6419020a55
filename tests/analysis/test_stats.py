"""Comparison statistics on hand-made metric histories with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polyrl.analysis.stats import (
    arm_difference,
    bootstrap_interval,
    curve_band,
    holm_adjusted,
    interquartile_mean,
    mean_interval,
    paired_difference,
    verdict,
    welch_difference,
)


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


def test_arms_with_the_same_seeds_are_compared_paired_by_seed():
    # a = {10, 20, 30}, b = {8, 17, 26} by seed: per-seed differences [2, 3, 4], mean 3, s = 1,
    # sem = 1/√3 = 0.577350, t_{0.975, df=2} = 4.302653 → half-width 2.484138 → (0.515862, 5.484138).
    # Unpaired (Welch), the seed-to-seed spread (var 100 and 81) swamps it: se = √(100/3 + 81/3) = 7.767453.
    a, b = {0: 10.0, 1: 20.0, 2: 30.0}, {0: 8.0, 1: 17.0, 2: 26.0}
    paired = arm_difference(a, b)
    assert paired.method == "paired" and paired.interval.estimate == pytest.approx(3.0)
    assert paired.interval.low == pytest.approx(0.515862, abs=1e-6) and paired.interval.high == pytest.approx(5.484138, abs=1e-6)
    # t = 3 / 0.577350 = 5.196152 on 2 df; two-sided p = 1 − t/√(2 + t²) (the t_2 closed form)
    # = 1 − 5.196152/√29 = 1 − 5.196152/5.385165 = 0.035099
    assert paired.p_value == pytest.approx(0.035099, abs=1e-6)
    assert paired_difference(a, b).n == 3
    welch = welch_difference(list(a.values()), list(b.values()))
    assert welch.contains(0.0) and not paired.interval.contains(0.0)
    # Other seeds: unpaired, and said so.
    other = arm_difference(a, {3: 8.0, 4: 17.0, 5: 26.0})
    assert (
        other.method == "Welch"
        and other.interval.low == pytest.approx(welch.low)
        and other.interval.high == pytest.approx(welch.high)
    )


def test_holm_adjusts_over_all_comparisons_by_hand():
    # p = [0.01, 0.04, 0.03], m = 3: sorted 0.01 × 3 = 0.03; 0.03 × 2 = 0.06; 0.04 × 1 = 0.04 → max(0.06, 0.04) = 0.06.
    assert holm_adjusted([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # NaN (no test) stays NaN and is not counted: m = 2 → 0.02 × 2 = 0.04, 0.5 × 1 → 0.5.
    adjusted = holm_adjusted([0.02, math.nan, 0.5])
    assert adjusted[0] == pytest.approx(0.04) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.5)
    assert holm_adjusted([0.3, 0.4]) == pytest.approx([0.6, 0.6])  # capped at 1 only when needed; monotone


def test_a_verdict_that_does_not_survive_holm_says_so():
    difference = arm_difference({0: 10.0, 1: 20.0, 2: 30.0}, {0: 8.0, 1: 17.0, 2: 26.0})
    lost = verdict(difference.interval, names=("a", "b"), adjusted_p=0.105, comparisons=3)
    assert "not distinguishable from noise after Holm's correction over 3 comparisons" in lost and "adjusted p = 0.1" in lost
    kept = verdict(difference.interval, names=("a", "b"), adjusted_p=0.035, comparisons=1)
    assert "a is higher" in kept and "holds after Holm's correction over 1 comparisons" in kept
