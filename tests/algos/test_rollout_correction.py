"""Rollout correction maths (polyrl/algos/rollout_correction.py), against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.algos.rollout_correction import (
    CorrectionSettings,
    apply_correction,
    geometric_mask,
    icepop_mask,
    k3_mask,
    mismatch_diagnostics,
    opsm_mask,
    sequence_mis_mask,
    sequence_tis,
    token_tis,
)

L2, L3 = math.log(2.0), math.log(3.0)
# Two rows; row 1 has one padding token (its log-ratio NaN: padding must not leak).
LOG_RATIO = torch.tensor([[L2, 0.0, -L2], [L3, -L3 / 2, float("nan")]])
MASK = torch.tensor([[True, True, True], [True, True, False]])


def test_token_tis_truncates_each_token():
    weights, m = token_tis(LOG_RATIO, MASK, threshold=2.5)
    # ratios: row 0: 2, 1, 0.5; row 1: 3 → 2.5, 3^-0.5 = 0.57735; padding 0
    expected = torch.tensor([[2.0, 1.0, 0.5], [2.5, 3**-0.5, 0.0]])
    torch.testing.assert_close(weights, expected)
    # mean over the 5 tokens: (2 + 1 + 0.5 + 2.5 + 0.57735) / 5 = 1.315470
    assert m["rollout_corr/is_weight_mean"] == pytest.approx(6.577350 / 5, abs=1e-6)
    assert m["rollout_corr/is_truncated_token_fraction"] == pytest.approx(1 / 5)
    assert m["rollout_corr/is_truncated_seq_fraction"] == pytest.approx(1 / 2)


def test_sequence_tis_uses_the_product_of_ratios():
    weights, m = sequence_tis(LOG_RATIO, MASK, threshold=1.5)
    # row 0: 2 · 1 · 0.5 = 1 → 1; row 1: 3 · 3^-0.5 = sqrt(3) = 1.732 → capped at 1.5
    expected = torch.tensor([[1.0, 1.0, 1.0], [1.5, 1.5, 0.0]])
    torch.testing.assert_close(weights, expected)
    assert m["rollout_corr/is_weight_mean"] == pytest.approx(1.25)  # (1 + 1.5) / 2 rows
    assert m["rollout_corr/is_truncated_seq_fraction"] == pytest.approx(0.5)
    assert m["rollout_corr/is_truncated_token_fraction"] == pytest.approx(2 / 5)


def test_sequence_mis_masks_rows_outside_the_band():
    keep, m = sequence_mis_mask(LOG_RATIO, MASK, low=0.5, high=1.5)
    # products 1 (kept) and sqrt(3) = 1.732 > 1.5 (row 1 dropped)
    assert keep.tolist() == [[True, True, True], [False, False, False]]
    assert m["rollout_corr/mis_masked_seq_fraction"] == 0.5
    assert m["rollout_corr/mis_masked_token_fraction"] == pytest.approx(2 / 5)


def test_geometric_mask_uses_the_per_token_mean():
    # geometric means: row 0 exp((ln2 + 0 − ln2)/3) = 1; row 1 exp((ln3 − ln3/2)/2) = 3^(1/4) = 1.316
    keep, m = geometric_mask(LOG_RATIO, MASK, low=0.8, high=1.3)
    assert keep.tolist() == [[True, True, True], [False, False, False]]
    keep, _ = geometric_mask(LOG_RATIO, MASK, low=0.8, high=1.32)
    assert keep.tolist() == [[True, True, True], [True, True, False]]


def test_k3_mask_thresholds_the_mean_k3():
    # k3(ρ) = ρ − 1 − ln ρ. Row 0: k3(2) = 0.306853, k3(1) = 0, k3(0.5) = 0.5 − 1 + ln2 = 0.193147 → mean 0.166667
    # Row 1: k3(3) = 2 − ln3 = 0.901388, k3(3^-0.5) = 0.577350 − 1 + 0.549306 = 0.126657 → mean 0.514023
    keep, m = k3_mask(LOG_RATIO, MASK, threshold=0.2)
    assert keep.tolist() == [[True, True, True], [False, False, False]]
    keep, _ = k3_mask(LOG_RATIO, MASK, threshold=0.16)
    assert not keep.any()
    keep, _ = k3_mask(LOG_RATIO, MASK, threshold=0.52)
    assert keep.tolist() == MASK.tolist()


def test_icepop_masks_single_tokens():
    keep, m = icepop_mask(LOG_RATIO, MASK, low=0.55, high=2.5)
    # ratios 2 ✓, 1 ✓, 0.5 ✗ (< 0.55); 3 ✗ (> 2.5), 0.577 ✓
    assert keep.tolist() == [[True, True, False], [False, True, False]]
    assert m["rollout_corr/icepop_masked_token_fraction"] == pytest.approx(2 / 5)
    assert m["rollout_corr/icepop_masked_seq_fraction"] == pytest.approx(1.0)


def test_opsm_masks_only_negative_advantage_rows_far_off_policy():
    # mean(log π_sampler − log π_target): row 0 = −(ln2 + 0 − ln2)/3 = 0; row 1 = −(ln3 − ln3/2)/2 = −0.2747.
    # Flip the sign of row 1 to make it far off policy: mean KL 0.2747.
    log_ratio = torch.tensor([[L2, 0.0, -L2], [-L3, L3 / 2, 0.0]])
    negative = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, 0.0]])
    keep, m = opsm_mask(log_ratio, MASK, negative, threshold=0.2)
    assert keep.tolist() == [[True, True, True], [False, False, False]]
    assert m["rollout_corr/opsm_masked_seq_fraction"] == 0.5
    # the same row with a positive advantage stays
    keep, _ = opsm_mask(log_ratio, MASK, -negative, threshold=0.2)
    assert keep.tolist() == MASK.tolist()
    # and a looser threshold keeps it too
    keep, _ = opsm_mask(log_ratio, MASK, negative, threshold=0.3)
    assert keep.tolist() == MASK.tolist()


def test_apply_correction_combines_masks_and_weights():
    settings = CorrectionSettings(is_level="token", is_threshold=2.5, icepop=(0.55, 2.5), mis=(0.5, 1.5))
    weights, keep, m = apply_correction(LOG_RATIO, MASK, torch.ones(2, 3), settings=settings)
    # MIS drops row 1; ICEPOP drops token (0, 2) → kept tokens: (0, 0), (0, 1)
    assert keep.tolist() == [[True, True, False], [False, False, False]]
    assert m["rollout_corr/masked_token_fraction"] == pytest.approx(3 / 5)
    assert m["rollout_corr/masked_seq_fraction"] == pytest.approx(1.0)
    torch.testing.assert_close(weights[0], torch.tensor([2.0, 1.0, 0.5]))
    # without importance (bypass: the objective's ratio is already the weight) the weights are the mask
    weights, _, m = apply_correction(LOG_RATIO, MASK, torch.ones(2, 3), settings=settings, importance=False)
    assert weights.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
    assert "rollout_corr/is_weight_mean" not in m


def test_mismatch_diagnostics_by_hand():
    learner = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]])
    sampler = torch.tensor([[-1.5, -2.0], [-1.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    m = mismatch_diagnostics(learner, sampler, mask)
    # log r = learner − sampler on the 3 tokens: 0.5, 0, 0.5
    # k1 = mean(−log r) = −1/3; k3 = mean(e^x − 1 − x) = 2·(1.648721 − 1.5)/3 = 0.099147
    assert m["rollout_corr/kl"] == pytest.approx(-1 / 3)
    assert m["rollout_corr/k3_kl"] == pytest.approx(2 * (math.exp(0.5) - 1.5) / 3, rel=1e-6)
    assert m["rollout/logprob_gap"] == pytest.approx(1 / 3)
    # chi2 = mean(e^{2x} − 1) = 2·(e − 1)/3 = 1.145521
    assert m["rollout_corr/chi2_token"] == pytest.approx(2 * (math.e - 1) / 3, rel=1e-6)
    # log-ppl diff per row, learner minus sampler: row 0 −(0.5 + 0)/2 = −0.25; row 1 −0.5 → mean −0.375
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx(-0.375)
    assert m["rollout_corr/compared_tokens"] == 3


def test_mismatch_is_zero_for_identical_policies_and_empty_without_tokens():
    lp = torch.tensor([[-1.0, -2.0]])
    m = mismatch_diagnostics(lp, lp.clone(), torch.ones(1, 2, dtype=torch.bool))
    assert m["rollout_corr/k3_kl"] == 0 and m["rollout_corr/kl"] == 0 and m["rollout/logprob_gap"] == 0
    assert mismatch_diagnostics(lp, lp, torch.zeros(1, 2, dtype=torch.bool)) == {}
