"""pass@k (Chen et al. 2021, arXiv 2107.03374): hand-computed values and the binomial form."""

from __future__ import annotations

import math

import pytest

from polyrl.evals.passk import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (4, 1, 1, 0.25),  # 1 − C(3,1)/C(4,1) = 1 − 3/4
        (4, 1, 2, 0.5),  # 1 − C(3,2)/C(4,2) = 1 − 3/6
        (4, 1, 4, 1.0),  # every 4-subset holds the correct one
        (5, 2, 2, 0.7),  # 1 − C(3,2)/C(5,2) = 1 − 3/10
        (10, 3, 5, 1 - 21 / 252),  # C(7,5)=21, C(10,5)=252
        (3, 0, 2, 0.0),
        (3, 3, 1, 1.0),
        (6, 4, 3, 1.0),  # n − c = 2 < k = 3
    ],
)
def test_eval_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_eval_pass_at_k_matches_binomial_ratio_on_a_grid():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


def test_eval_pass_at_k_is_stable_for_large_n():
    # C(2000, 100) overflows a float; the product form does not.
    value = pass_at_k(2000, 10, 100)
    assert 0.0 < value < 1.0
    assert value == pytest.approx(1 - math.prod((2000 - 100 - i) / (2000 - i) for i in range(10)), rel=1e-9)


def test_eval_pass_at_1_is_the_share_of_correct_samples():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert mean_pass_at_k([(4, 1), (4, 0), (4, 4)], 1) == pytest.approx((0.25 + 0 + 1) / 3)


def test_eval_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(2, 3, 1)
    assert math.isnan(mean_pass_at_k([], 1))
