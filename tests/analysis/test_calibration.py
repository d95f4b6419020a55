"""A/A calibration: splits of one arm's seeds, the false-positive count, Wilson's interval."""

from __future__ import annotations

import numpy as np
import pytest

from polyrl.analysis.calibration import CalibrationError, aa_calibration, aa_splits, wilson_interval


def test_every_unordered_split_once():
    # 4 seeds, 2 a side: C(4,4) = 1 set of four, C(4,2) / 2 = 3 unordered halvings.
    assert aa_splits([3, 0, 1, 2], 2) == [([0, 1], [2, 3]), ([0, 2], [1, 3]), ([0, 3], [1, 2])]
    # 6 seeds, 2 a side: C(6,4) = 15 sets × 3 halvings = 45 splits, each side disjoint.
    splits = aa_splits(range(6), 2)
    assert len(splits) == 45 and all(not set(a) & set(b) for a, b in splits)
    # Above max_splits they are drawn (seeded: the same draws twice).
    assert aa_splits(range(30), 5, max_splits=50) == aa_splits(range(30), 5, max_splits=50)
    assert len(aa_splits(range(30), 5, max_splits=50)) == 50


def test_too_few_seeds_are_refused_with_what_is_needed():
    with pytest.raises(CalibrationError, match="5 finished seed runs cannot make two sides of 3 \\(needs 6\\)"):
        aa_splits(range(5), 3)
    with pytest.raises(CalibrationError, match="at least 2 seeds a side"):
        aa_splits(range(5), 1)


def test_wilson_interval_by_hand():
    # 0 of 10, z = 1.96: centre = (z²/20) / (1 + z²/10) = 0.19208 / 1.38416 = 0.13877, and the
    # half-width = z·√(z²/400) / 1.38416 = 1.96 · 0.098 / 1.38416 = 0.13877: [0, 0.2775].
    low, high = wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-9) and high == pytest.approx(0.2775, abs=1e-3)


def test_one_outlying_seed_is_caught_by_the_splits_that_pair_it():
    # Seeds 0..3 at 0, 0.1, 0.2, 0.3 and seed 4 far off at 10. With 2 a side, a split whose
    # two pairs both have the same sign and similar size is called different: e.g. A = {0, 1},
    # A′ = {3, 4}... differences [0 − 0.3, 0.1 − 10] = [−0.3, −9.9]: mean −5.1, sd 6.79, half-width
    # 12.706 · 6.79 / √2 = 61: contains 0. Only near-constant differences are excluded at n = 2.
    finals = {0: 0.0, 1: 0.1, 2: 0.2, 3: 0.3, 4: 10.0}
    result = aa_calibration(finals, "m", 2)
    assert result.splits == 15 and result.seeds == 5 and result.disjoint == 1
    # A = {0, 2}, A′ = {1, 3}: differences [−0.1, −0.1], sd 0: the interval is the point −0.1 (excludes 0);
    # A = {0, 1}, A′ = {2, 3}: [−0.2, −0.2], likewise. Both are false positives of a zero spread.
    assert result.fixed_false >= 2
    assert "A/A at 2 seeds a side (5 seed runs, 15 splits, 1 disjoint)" in result.describe()


def test_with_normal_seeds_the_false_positive_rate_is_near_nominal():
    # 60 seeds drawn iid normal: every split is an A/A pair of a valid paired-t setting, so the
    # paired interval's false "different" share is 5% up to the splits' dependence (2,000 random
    # splits of 4 a side). The sequential rule, which spends its α over looks, stays below that.
    rng = np.random.default_rng(7)
    finals = {seed: float(value) for seed, value in enumerate(rng.normal(0.5, 0.1, size=60))}
    result = aa_calibration(finals, "eval/x/accuracy", 4, max_splits=2000)
    assert 0.02 <= result.fixed_rate <= 0.085
    assert result.sequential_rate <= result.fixed_rate + 0.01
