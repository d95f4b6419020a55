"""REINFORCE++, REINFORCE++-baseline, ReMax and GPG advantage estimators: values by hand,
equality with verl's estimators on the same tensors, unscored rows and garbage under the mask."""

import math

import pytest
import torch

from polyrl.algos.advantages import AdvantageInputs, get_advantage

F64 = torch.float64
NAN = math.nan


def _mask(lengths, width=3):
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def _run(name, rewards, mask, **fields):
    spec = get_advantage(name)
    params = {k: fields.pop(k) for k in list(fields) if k in spec.params.model_fields}
    inputs = AdvantageInputs(rewards=torch.as_tensor(rewards, dtype=F64), mask=mask, **fields)
    return spec.fn(inputs, **{**spec.default_params, **params})


def _close(actual, expected):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=F64), atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------------
# REINFORCE++


def test_reinforce_pp_sequence_rewards_by_hand():
    mask = _mask([2, 3, 1])
    advantages, metrics = _run("reinforce_pp", [1.0, 0.0, 2.0], mask)
    # gamma 1: each token's return is its row's reward: tokens 1, 1 | 0, 0, 0 | 2.
    # mean 4/6 = 2/3; unbiased var = ((1/3)^2 * 2 + (2/3)^2 * 3 + (4/3)^2) / 5 = (30/9) / 5 = 2/3
    scale = 1 / math.sqrt(2 / 3 + 1e-8)
    a, b, c = (1 - 2 / 3) * scale, (0 - 2 / 3) * scale, (2 - 2 / 3) * scale
    _close(advantages, [[a, a, 0.0], [b, b, b], [c, 0.0, 0.0]])
    assert metrics["advantage/return_mean"] == pytest.approx(4 / 6, abs=1e-12)


def test_reinforce_pp_discounted_token_rewards_by_hand():
    # Token rewards as the pipeline makes them with train.kl_in_reward (R on the last token
    # minus beta * k1 on every token), gamma 0.5:
    #   row 0: r = [-0.1, 0.9]        G = [-0.1 + 0.5 * 0.9, 0.9]             = [0.35, 0.9]
    #   row 1: r = [0.2, -0.2, 1.0]   G = [0.2 + 0.5 * 0.3, -0.2 + 0.5 * 1.0, 1.0] = [0.35, 0.3, 1.0]
    # mean 2.9 / 5 = 0.58; deviations -0.23, 0.32, -0.23, -0.28, 0.42;
    # unbiased var (0.0529 + 0.1024 + 0.0529 + 0.0784 + 0.1764) / 4 = 0.463 / 4 = 0.11575
    mask = _mask([2, 3])
    rewards = [[-0.1, 0.9, 0.0], [0.2, -0.2, 1.0]]
    advantages, _ = _run("reinforce_pp", rewards, mask, gamma=0.5)
    scale = 1 / math.sqrt(0.11575 + 1e-8)
    _close(advantages, [[-0.23 * scale, 0.32 * scale, 0.0], [-0.23 * scale, -0.28 * scale, 0.42 * scale]])


def _verl_masked_whiten(values, mask):
    mean = (values * mask).sum() / mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / (mask.sum() - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


def _verl_reinforce_pp(token_rewards, mask, gamma):
    """verl core_algos.compute_reinforce_plus_plus_outcome_advantage, written out."""
    returns = torch.zeros_like(token_rewards)
    running = 0
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return _verl_masked_whiten(returns, mask) * mask


def _verl_reinforce_pp_baseline(token_rewards, mask, index):
    """verl core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage, written out."""
    scores = token_rewards.sum(-1).clone()
    for group in set(index.tolist()):
        rows = index == group
        if rows.sum() > 1:
            scores[rows] = scores[rows] - scores[rows].mean()
    scores = scores[:, None] * mask
    return _verl_masked_whiten(scores, mask) * mask


def test_reinforce_pp_equals_verl_on_the_same_tensors():
    generator = torch.Generator().manual_seed(0)
    mask = _mask([5, 2, 4, 1], width=5)
    rewards = torch.where(mask, torch.randn(4, 5, generator=generator, dtype=F64), 0.0)
    ours, _ = _run("reinforce_pp", rewards, mask, gamma=0.9)
    torch.testing.assert_close(ours, _verl_reinforce_pp(rewards, mask.to(F64), 0.9), atol=1e-12, rtol=0)


def test_reinforce_pp_baseline_by_hand():
    # Groups {0, 1}: rewards 1, 0 -> mean 0.5 -> +0.5, -0.5; {2, 3}: 1, 1 -> 0, 0.
    # Tokens (lengths 1, 2, 2, 1): 0.5 | -0.5, -0.5 | 0, 0 | 0; mean -0.5 / 6 = -1/12;
    # deviations 7/12, -5/12, -5/12, 1/12, 1/12, 1/12; unbiased var = (49 + 25 + 25 + 1 + 1 + 1) / 144 / 5
    mask = _mask([1, 2, 2, 1])
    advantages, _ = _run("reinforce_pp_baseline", [1.0, 0.0, 1.0, 1.0], mask, group_ids=torch.tensor([0, 0, 1, 1]))
    scale = 1 / math.sqrt(102 / 144 / 5 + 1e-8)
    p, n, z = 7 / 12 * scale, -5 / 12 * scale, 1 / 12 * scale
    _close(advantages, [[p, 0, 0], [n, n, 0], [z, z, 0], [z, 0, 0]])


def test_reinforce_pp_baseline_equals_verl_on_the_same_tensors():
    generator = torch.Generator().manual_seed(1)
    mask = _mask([3, 1, 4, 2, 4, 3], width=4)
    rewards = torch.randn(6, generator=generator, dtype=F64)
    index = torch.tensor([0, 0, 0, 1, 1, 1])
    ours, _ = _run("reinforce_pp_baseline", rewards, mask, group_ids=index)
    token_rewards = torch.zeros(6, 4, dtype=F64)
    token_rewards[torch.arange(6), mask.sum(-1) - 1] = rewards
    reference = _verl_reinforce_pp_baseline(token_rewards, mask.to(F64), index)
    torch.testing.assert_close(ours, reference, atol=1e-12, rtol=0)


def test_uniform_batch_gives_about_zero_not_amplified_rounding_noise():
    # Every return 0.1 in float32: x - mean is rounding noise (~1e-9); eps inside the square root
    # scales it by 1/sqrt(1e-8) = 1e4 (~1e-5), where dividing by std + 1e-8 would scale it by 1e8 (~0.1).
    inputs = AdvantageInputs(rewards=torch.full((3,), 0.1), mask=_mask([3, 2, 1]))
    advantages, _ = get_advantage("reinforce_pp").fn(inputs)
    assert advantages.abs().max() < 1e-4


@pytest.mark.parametrize("name", ["reinforce_pp", "reinforce_pp_baseline"])
def test_unscored_rows_get_zero_and_enter_no_statistic(name):
    mask = _mask([2, 3, 1])
    groups = torch.tensor([0, 0, 0])
    with_nan, _ = _run(name, [1.0, NAN, 2.0], mask, group_ids=groups)
    assert torch.equal(with_nan[1], torch.zeros(3, dtype=F64))
    without, _ = _run(name, [1.0, 2.0], _mask([2, 1]), group_ids=torch.tensor([0, 0]))
    torch.testing.assert_close(with_nan[[0, 2]], without, atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------------
# ReMax


def test_remax_by_hand():
    mask = _mask([2, 1, 3])
    advantages, metrics = _run("remax", [1.0, 0.0, 1.0], mask, baselines=torch.tensor([0.5, 0.5, NAN], dtype=F64))
    # R - b on every response token: 1 - 0.5, 0 - 0.5; row 2's greedy sample is unscored: 0.
    _close(advantages, [[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert metrics["advantage/greedy_baseline_mean"] == 0.5


def test_remax_token_rewards_use_the_reward_to_go_as_verl():
    # r = [0.1, 1.0], b = 0.3: reward-to-go [1.1, 1.0] - 0.3 = [0.8, 0.7] (verl's remax).
    advantages, _ = _run("remax", [[0.1, 1.0, 0.0]], _mask([2]), baselines=torch.tensor([0.3], dtype=F64))
    _close(advantages, [[0.8, 0.7, 0.0]])


def test_remax_needs_the_baselines():
    assert "baselines" in get_advantage("remax").requires
    with pytest.raises(ValueError, match="baselines"):
        _run("remax", [1.0], _mask([1]))


# ---------------------------------------------------------------------------------------------
# GPG


def test_gpg_by_hand():
    # Groups {0,1}: 1, 0 (mean 0.5); {2,3}: 1, 1 and {4,5}: 0, 0 agree (advantage 0).
    # B = 6, M = 4 samples in agreeing groups: alpha = 6 / (6 - 4) = 3; A = 3 * (R - mean).
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    mask = _mask([1, 2, 1, 1, 1, 1])
    advantages, metrics = _run("gpg", rewards, mask, group_ids=groups)
    _close(advantages[:, 0], [1.5, -1.5, 0, 0, 0, 0])
    _close(advantages[1], [-1.5, -1.5, 0])
    assert metrics["advantage/gpg_alpha"] == 3.0
    # F_norm = group std: std([1, 0]) = sqrt(0.5) (unbiased); 3 * 0.5 / (sqrt(0.5) + 1e-6)
    normed, _ = _run("gpg", rewards, mask, group_ids=groups, std_normalize=True)
    assert float(normed[0, 0]) == pytest.approx(1.5 / (math.sqrt(0.5) + 1e-6), abs=1e-12)


def test_gpg_all_groups_agreeing_gives_zero_with_alpha_one():
    advantages, metrics = _run("gpg", [1.0, 1.0], _mask([1, 1]), group_ids=torch.tensor([0, 0]))
    assert torch.equal(advantages, torch.zeros(2, 3, dtype=F64)) and metrics["advantage/gpg_alpha"] == 1.0


# ---------------------------------------------------------------------------------------------
# Garbage under the mask


@pytest.mark.parametrize("name", ["reinforce_pp", "reinforce_pp_baseline", "remax", "gpg"])
def test_garbage_under_the_mask_changes_nothing(name):
    mask = _mask([2, 3, 1, 2])
    clean = torch.tensor([[0.1, 1.0, 0.0], [0.0, 0.2, 0.5], [1.0, 0.0, 0.0], [0.3, -0.4, 0.0]], dtype=F64)
    dirty = torch.where(mask, clean, torch.full_like(clean, 1e30))
    fields = {"group_ids": torch.tensor([0, 0, 1, 1]), "baselines": torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)}
    a, _ = _run(name, clean, mask, **fields)
    b, _ = _run(name, dirty, mask, **fields)
    assert torch.isfinite(a).all() and torch.equal(a, b)
    assert torch.equal(a[~mask], torch.zeros_like(a[~mask]))
