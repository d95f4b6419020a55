"""The shared statistics: masked mean/std (losses) and the group index (groups)."""

import math

import torch

from polyrl.algos.groups import group_index
from polyrl.algos.losses import masked_mean_std

F64 = torch.float64


def test_masked_mean_std_by_hand():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, float("nan"), float("inf")]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    # response values 1, 2, 3 (100, NaN and inf are masked): mean 2; squared deviations 1 + 0 + 1 = 2
    mean, std = masked_mean_std(x, mask)
    assert float(mean) == 2.0 and float(std) == math.sqrt(2 / 3)  # population: 2 / 3
    _, unbiased = masked_mean_std(x, mask, unbiased=True)
    assert float(unbiased) == 1.0  # Bessel: 2 / (3 - 1)


def test_masked_mean_std_of_one_or_no_position():
    x = torch.tensor([[5.0, 7.0]], dtype=F64)
    for unbiased in (False, True):
        mean, std = masked_mean_std(x, torch.tensor([[0, 1]], dtype=torch.bool), unbiased=unbiased)
        assert (float(mean), float(std)) == (7.0, 0.0)
        mean, std = masked_mean_std(x, torch.zeros(1, 2, dtype=torch.bool), unbiased=unbiased)
        assert (float(mean), float(std)) == (0.0, 0.0)


def test_group_index_numbers_groups_in_sorted_id_order():
    inverse, count = group_index(torch.tensor([7, 3, 7, 11]))
    assert inverse.tolist() == [1, 0, 1, 2] and count == 3
    inverse, count = group_index(torch.tensor([], dtype=torch.long))
    assert inverse.numel() == 0 and count == 0


def test_a_group_whose_rewards_agree_has_exactly_their_mean_std_zero_and_grpo_advantage_zero():
    from polyrl.algos.advantages import AdvantageInputs, get_advantage
    from polyrl.algos.groups import group_mean_std

    # Eight rewards of 0.1 in float32: their sum over their count is 0.1 - 7.45e-9, and the unbiased std of
    # the rounded deviations 7e-9. Before: each got (0.1 - mean) / (7e-9 + 1e-6) = -0.0074 as its GRPO
    # advantage, and the group did not count as uniform (std != 0). Group 1, (0.1, 1.1) x 4, is untouched.
    rewards = torch.tensor([0.1] * 8 + [0.1, 1.1] * 4, dtype=torch.float32)
    group_ids = torch.tensor([0] * 8 + [1] * 8)
    mean, std, size = group_mean_std(rewards, group_ids)
    assert torch.equal(mean[:8], rewards[:8]) and torch.equal(std[:8], torch.zeros(8))
    advantages, metrics = get_advantage("group_norm").fn(AdvantageInputs(rewards, torch.ones(16, 1), group_ids))
    assert torch.equal(advantages[:8, 0], torch.zeros(8))
    # Group 1: mean 0.6, unbiased std sqrt(8 * 0.25 / 7) = 0.5345 -> (-/+) 0.5 / 0.5345 = 0.9354.
    assert torch.allclose(advantages[8:, 0].abs(), torch.full((8,), 0.9354143), atol=1e-5)
    assert metrics["advantage/uniform_group_sample_frac"] == 0.5
