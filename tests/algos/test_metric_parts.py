"""Metrics over micro-batches mean what they say: ratios of sums, extremes by max/min, and the
same values however the batch is cut (before: means of per-micro-batch ratios and extremes)."""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.algos.aggregation import global_loss_normalizer
from polyrl.algos.metric_parts import PARTS_PREFIX, MetricAccumulator
from polyrl.algos.objectives import get_objective

F64 = torch.float64


def _metrics(new_p, old_p, advantages, normalizer):
    """PPO's metrics (clip 0.2 both sides, token_mean) on one micro-batch of one row."""
    spec = get_objective("ppo")
    mask = torch.ones(1, len(new_p), dtype=torch.bool)
    _, metrics = spec.fn(
        torch.tensor([new_p], dtype=F64).log(), torch.tensor([old_p], dtype=F64).log(), torch.tensor([advantages], dtype=F64),
        mask, loss_normalizer=normalizer, aggregation="token_mean", **spec.default_params,
    )  # fmt: skip
    return metrics, float(mask.sum())


def test_two_micro_batches_of_different_sizes_combine_as_ratios_of_sums_and_extremes():
    # Micro-batch 1: one token, A = +1, ratio 0.66 / 0.6 = 1.1, probability 0.66 (high, >= 0.5).
    # Micro-batch 2: three tokens, A = (-1, 0, 0), ratios 0.9, 1.0, 1.3, probabilities < 0.5 (low).
    normalizer = 4.0
    first = _metrics([0.66], [0.6], [1.0], normalizer)
    second = _metrics([0.27, 0.3, 0.39], [0.3, 0.3, 0.3], [-1.0, 0.0, 0.0], normalizer)
    accumulated = MetricAccumulator()
    for metrics, tokens in (first, second):
        accumulated.add(metrics, tokens)
    out = accumulated.result()
    # ratio_max: max(1.1, 1.3) = 1.3 (the token-weighted mean of extremes was (1.1*1 + 1.3*3)/4 = 1.25);
    # ratio_min: min(1.1, 0.9) = 0.9 (was (1.1*1 + 0.9*3)/4 = 0.95).
    assert out["ratio_max"] == pytest.approx(1.3, abs=1e-12)
    assert out["ratio_min"] == pytest.approx(0.9, abs=1e-12)
    # pos_loss_share: |loss| of the signed tokens is 1.1 (A>0, r 1.1 unclipped) and 0.9 (A<0, r 0.9
    # within [0.8, 1.2]): 1.1 / (1.1 + 0.9) = 0.55 (was (1.0*1 + 0.0*3)/4 = 0.25).
    assert out["pos_loss_share"] == pytest.approx(0.55, abs=1e-12)
    # positive_share (kept |r*A|, none clipped): 1.1 / (1.1 + 0.9) = 0.55 (was 0.25 likewise).
    assert out["positive_share"] == pytest.approx(0.55, abs=1e-12)
    # Quadrants over the 2 signed tokens: high-prob/positive 1 of 2, low-prob/negative 1 of 2
    # (were (1*1 + 0*3)/4 = 0.25 and (0*1 + 1*3)/4 = 0.75).
    assert out["quadrant/high_prob_pos_adv"] == pytest.approx(0.5, abs=1e-12)
    assert out["quadrant/low_prob_neg_adv"] == pytest.approx(0.5, abs=1e-12)
    assert out["quadrant/high_prob_neg_adv"] == out["quadrant/low_prob_pos_adv"] == 0.0
    # Token means stay token means: ratio_mean (1.1 + 0.9 + 1.0 + 1.3) / 4 = 1.075.
    assert out["ratio_mean"] == pytest.approx(1.075, abs=1e-12)
    assert not any(key.startswith(PARTS_PREFIX) for key in out)  # the sums stay inside


def test_two_ranks_merge_like_one():
    normalizer = 4.0
    first = _metrics([0.66], [0.6], [1.0], normalizer)
    second = _metrics([0.27, 0.3, 0.39], [0.3, 0.3, 0.3], [-1.0, 0.0, 0.0], normalizer)
    one, rank0, rank1 = MetricAccumulator(), MetricAccumulator(), MetricAccumulator()
    for metrics, tokens in (first, second):
        one.add(metrics, tokens)
    rank0.add(*first)
    rank1.add(*second)
    merged = MetricAccumulator.merged([rank0.state(), rank1.state()]).result()
    expected = one.result()
    assert merged.keys() == expected.keys()
    assert all(math.isclose(merged[k], expected[k], abs_tol=1e-12) for k in expected)
    # A rank whose micro-batch had no loss tokens reports a neutral ratio extreme that is no token's.
    empty = MetricAccumulator()
    empty.add({"ratio_max": 1.0, "ratio_min": 1.0}, 0.0)
    with_empty = MetricAccumulator.merged([rank0.state(), empty.state()]).result()
    assert with_empty["ratio_max"] == with_empty["ratio_min"] == pytest.approx(1.1, abs=1e-12)


def test_a_ratio_with_no_denominator_keeps_what_the_micro_batches_reported():
    # No signed token at all: pos_loss_share is 0.0 as the objective reports it; positive_share stays absent.
    metrics, tokens = _metrics([0.5, 0.5], [0.5, 0.5], [0.0, 0.0], global_loss_normalizer(torch.ones(1, 2), mode="token_mean"))
    accumulated = MetricAccumulator()
    accumulated.add(metrics, tokens)
    out = accumulated.result()
    assert out["pos_loss_share"] == 0.0 and "positive_share" not in out
