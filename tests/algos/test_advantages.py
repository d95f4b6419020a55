import math

import pytest
import torch

from polyrl.algos.advantages import (
    AdvantageInputs,
    dapo_dynamic_sampling_keep,
    dapo_overlong_penalty,
    generalized_advantage_estimation,
    get_advantage,
    list_advantages,
)

F64 = torch.float64
NAN = math.nan
EPS = 1e-6  # group_norm's default eps

# Two prompts: group 0 has rewards 1, 0, 0, 1 and group 1 has 2, 2; ids need not be contiguous.
REWARDS = torch.tensor([1.0, 2.0, 0.0, 0.0, 2.0, 1.0], dtype=F64)
GROUPS = torch.tensor([7, 3, 7, 7, 3, 7])
MASK = torch.tensor([[1, 1, 0]] * 6, dtype=torch.bool)


def _sequence_column(advantages: torch.Tensor) -> torch.Tensor:
    assert torch.equal(advantages[:, 2], torch.zeros(6, dtype=F64))  # zero off the response
    torch.testing.assert_close(advantages[:, 0], advantages[:, 1], atol=0, rtol=0)
    return advantages[:, 0]


def _estimate(name, rewards=REWARDS, **params):
    return get_advantage(name).fn(AdvantageInputs(rewards=rewards, mask=MASK, group_ids=GROUPS), **params)


def test_group_norm_by_hand():
    advantages, metrics = _estimate("group_norm")
    # group 7: rewards 1, 0, 0, 1; mean 0.5; unbiased std sqrt((4 * 0.25) / 3) = sqrt(1/3)
    #   A = +-0.5 / (sqrt(1/3) + 1e-6) = +-0.866025
    # group 3: rewards 2, 2 -> std 0 -> A = 0 / (0 + eps) = 0
    a = 0.5 / (math.sqrt(1 / 3) + EPS)
    expected = torch.tensor([a, 0.0, -a, -a, 0.0, a], dtype=F64)
    torch.testing.assert_close(_sequence_column(advantages), expected, atol=1e-12, rtol=0)
    assert metrics["advantage/uniform_group_sample_frac"] == pytest.approx(2 / 6, abs=1e-12, rel=0)


def test_group_norm_with_batch_std_by_hand():
    advantages, _ = _estimate("group_norm", std_scale="batch")
    # batch rewards 1, 2, 0, 0, 2, 1: mean 1, squared deviations 0+1+1+1+1+0 = 4, unbiased var 4/5
    # A = (R - group mean) / (sqrt(0.8) + eps): group 7 +-0.5 / 0.894427, group 3: 0
    a = 0.5 / (math.sqrt(0.8) + EPS)
    expected = torch.tensor([a, 0.0, -a, -a, 0.0, a], dtype=F64)
    torch.testing.assert_close(_sequence_column(advantages), expected, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="group, batch"):
        _estimate("group_norm", std_scale="global")


def test_group_mean_centered_by_hand():
    advantages, _ = _estimate("group_mean_centered")
    # R - group mean: group 7 (mean 0.5) -> +-0.5; group 3 (mean 2) -> 0
    expected = torch.tensor([0.5, 0.0, -0.5, -0.5, 0.0, 0.5], dtype=F64)
    torch.testing.assert_close(_sequence_column(advantages), expected, atol=1e-12, rtol=0)
    no_std, _ = _estimate("group_norm", use_std=False)
    torch.testing.assert_close(no_std, advantages, atol=0, rtol=0)


def test_rloo_by_hand():
    advantages, _ = _estimate("rloo")
    # group 7: R=1 -> 1 - (0+0+1)/3 = 2/3;  R=0 -> 0 - (1+0+1)/3 = -2/3;  group 3: 2 - 2 = 0
    expected = torch.tensor([2 / 3, 0.0, -2 / 3, -2 / 3, 0.0, 2 / 3], dtype=F64)
    torch.testing.assert_close(_sequence_column(advantages), expected, atol=1e-12, rtol=0)


def test_single_sample_groups_get_zero_advantage():
    mask = torch.ones(2, 1, dtype=torch.bool)
    for name in ("group_norm", "rloo"):
        advantages, _ = get_advantage(name).fn(
            AdvantageInputs(rewards=torch.tensor([3.0, 1.0], dtype=F64), mask=mask, group_ids=torch.tensor([0, 1]))
        )
        assert torch.equal(advantages, torch.zeros(2, 1, dtype=F64))


def test_token_rewards_are_summed_for_sequence_estimators():
    token_rewards = torch.tensor([[0.5, 0.5, NAN]] + [[0.0, 0.0, 5.0]] * 5, dtype=F64)
    token_rewards[1, 0] = 2.0
    token_rewards[4, 1] = 2.0
    token_rewards[5, 1] = 1.0
    # masked sums: 1, 2, 0, 0, 2, 1 == REWARDS
    from_tokens, _ = _estimate("group_norm", rewards=token_rewards)
    from_sequences, _ = _estimate("group_norm")
    torch.testing.assert_close(from_tokens, from_sequences, atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------------
# GAE


def _gae_reference(rewards, values, mask, gamma, lam):
    """Textbook scalar GAE run on each row's response tokens only (masked tokens dropped)."""
    advantages = torch.zeros_like(rewards)
    for row in range(rewards.shape[0]):
        positions = [t for t in range(rewards.shape[1]) if mask[row, t]]
        next_value, next_advantage = 0.0, 0.0
        for t in reversed(positions):
            delta = float(rewards[row, t]) + gamma * next_value - float(values[row, t])
            next_advantage = delta + gamma * lam * next_advantage
            next_value = float(values[row, t])
            advantages[row, t] = next_advantage
    return advantages


def test_gae_with_constant_tensors_equals_the_scalar_recursion():
    torch.manual_seed(0)
    rewards = torch.randn(4, 7, dtype=F64)
    values = torch.randn(4, 7, dtype=F64)
    mask = torch.tensor(
        [
            [1, 1, 1, 1, 1, 1, 1],
            [1, 1, 0, 0, 1, 1, 0],  # an interior masked span and trailing padding
            [0, 1, 1, 1, 0, 0, 0],
            [0, 0, 0, 0, 0, 0, 0],
        ],
        dtype=torch.bool,
    )
    gammas = torch.full((4, 7), 0.97, dtype=F64)
    lambdas = torch.full((4, 7), 0.9, dtype=F64)
    advantages, returns = generalized_advantage_estimation(rewards, values, mask, gammas, lambdas)
    expected = _gae_reference(rewards, values, mask, 0.97, 0.9)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(returns, torch.where(mask, expected + values, 0.0), atol=1e-12, rtol=0)
    scalar_advantages, _ = generalized_advantage_estimation(rewards, values, mask, 0.97, 0.9)
    torch.testing.assert_close(scalar_advantages, advantages, atol=0, rtol=0)


def test_gae_uses_each_tokens_own_gamma_and_lambda():
    # tokens: image, image, text, text; image gamma .85 lambda .8, text gamma .95 lambda .9
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=F64)
    values = torch.tensor([[0.5, 0.4, 0.3, 0.2]], dtype=F64)
    gammas = torch.tensor([[0.85, 0.85, 0.95, 0.95]], dtype=F64)
    lambdas = torch.tensor([[0.8, 0.8, 0.9, 0.9]], dtype=F64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    advantages, returns = generalized_advantage_estimation(rewards, values, mask, gammas, lambdas)
    # t3: delta = 1 + 0.95*0 - 0.2 = 0.8;                 A3 = 0.8
    # t2: delta = 0 + 0.95*0.2 - 0.3 = -0.11;             A2 = -0.11 + 0.95*0.9*0.8 = 0.574
    # t1: delta = 0 + 0.85*0.3 - 0.4 = -0.145;            A1 = -0.145 + 0.85*0.8*0.574 = 0.24532
    # t0: delta = 0 + 0.85*0.4 - 0.5 = -0.16;             A0 = -0.16 + 0.68*0.24532 = 0.0068176
    expected = torch.tensor([[0.0068176, 0.24532, 0.574, 0.8]], dtype=F64)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)
    # returns = A + V
    torch.testing.assert_close(returns, torch.tensor([[0.5068176, 0.64532, 0.874, 1.0]], dtype=F64), atol=1e-12, rtol=0)


def test_gae_carries_values_across_a_masked_token_in_the_middle():
    # token 2 (e.g. a tool or image token) is masked and holds garbage reward and value
    rewards = torch.tensor([[0.0, 0.0, 100.0, 0.0, 1.0]], dtype=F64)
    values = torch.tensor([[0.1, 0.2, NAN, 0.3, 0.4]], dtype=F64)
    mask = torch.tensor([[1, 1, 0, 1, 1]], dtype=torch.bool)
    advantages, _ = generalized_advantage_estimation(rewards, values, mask, 0.9, 0.5)
    # gamma*lambda = 0.45
    # t4: delta = 1 - 0.4 = 0.6;               A4 = 0.6
    # t3: delta = 0.9*0.4 - 0.3 = 0.06;        A3 = 0.06 + 0.45*0.6 = 0.33
    # t1 links to t3: delta = 0.9*0.3 - 0.2 = 0.07; A1 = 0.07 + 0.45*0.33 = 0.2185
    # t0: delta = 0.9*0.2 - 0.1 = 0.08;        A0 = 0.08 + 0.45*0.2185 = 0.178325
    expected = torch.tensor([[0.178325, 0.2185, 0.0, 0.33, 0.6]], dtype=F64)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)


def test_registered_gae_places_sequence_rewards_on_the_last_token_and_gives_value_targets():
    spec = get_advantage("gae")
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    values = torch.tensor([[0.5, 0.25, 9.0], [0.0, 0.0, 0.0]], dtype=F64)
    tensors = dict(
        rewards=torch.tensor([1.0, 2.0], dtype=F64),
        mask=mask,
        group_ids=None,
        values=values,
        gammas=torch.ones(2, 3, dtype=F64),
        lambdas=torch.ones(2, 3, dtype=F64),
    )
    advantages, _ = spec.fn(AdvantageInputs(**tensors), **spec.default_params)
    # gamma = lambda = 1: A_t = (sum of future rewards) - V_t
    # row 0: reward 1 on token 1 -> [1 - 0.5, 1 - 0.25, 0]; row 1: reward 2 on token 2 -> [2, 2, 2]
    expected = torch.tensor([[0.5, 0.75, 0.0], [2.0, 2.0, 2.0]], dtype=F64)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)
    returns, _ = spec.value_targets(AdvantageInputs(**tensors), **spec.default_params)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]], dtype=F64), atol=1e-12, rtol=0)


def test_gae_whitening_gives_zero_mean_unit_std_over_response_tokens():
    spec = get_advantage("gae")
    torch.manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    advantages, _ = spec.fn(AdvantageInputs(
        rewards=torch.randn(2, 4, dtype=F64), mask=mask, values=torch.randn(2, 4, dtype=F64),
        gammas=torch.full((2, 4), 0.9, dtype=F64), lambdas=torch.full((2, 4), 0.9, dtype=F64)), whiten=True,
    )  # fmt: skip
    response = advantages[mask]
    assert float(response.mean()) == pytest.approx(0.0, abs=1e-12)
    assert float(response.std()) == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(advantages[~mask], torch.zeros(3, dtype=F64))


def test_gae_reports_missing_tensors():
    with pytest.raises(ValueError, match="values"):
        get_advantage("gae").fn(AdvantageInputs(rewards=REWARDS, mask=MASK))
    with pytest.raises(ValueError, match="group_ids"):
        get_advantage("group_norm").fn(AdvantageInputs(rewards=REWARDS, mask=MASK))


# ---------------------------------------------------------------------------------------------
# Registry and DAPO helpers


def test_every_estimator_takes_the_uniform_call():
    tensors = dict(
        rewards=REWARDS,
        mask=MASK,
        group_ids=GROUPS,
        values=torch.zeros(6, 3, dtype=F64),
        gammas=torch.ones(6, 3, dtype=F64),
        lambdas=torch.ones(6, 3, dtype=F64),
        baselines=torch.zeros(6, dtype=F64),  # ReMax's greedy rewards
    )
    assert {spec.name for spec in list_advantages()} == {
        "group_norm", "group_mean_centered", "rloo", "gae",
        "reinforce_pp", "reinforce_pp_baseline", "remax", "gpg",  # tested in test_advantages_2026.py
    }  # fmt: skip
    for spec in list_advantages():
        advantages, metrics = spec.fn(AdvantageInputs(**tensors), **spec.default_params)
        assert advantages.shape == (6, 3)
        assert all(isinstance(value, float) for value in metrics.values())
        assert spec.fn.__doc__ and "arXiv" in spec.fn.__doc__ + spec.paper
    with pytest.raises(TypeError):
        get_advantage("rloo").fn(AdvantageInputs(**tensors), use_std=False)


def test_unknown_estimator_lists_the_registered_names():
    with pytest.raises(ValueError, match="registered estimators: .*group_norm.*gae"):
        get_advantage("vtrace")


def test_dapo_overlong_penalty_by_hand():
    lengths = torch.tensor([10, 16, 18, 20, 25])
    # L_max 20, L_cache 4: soft zone starts at 16; 18 -> (16 - 18) / 4 = -0.5; 20 -> -1; beyond -> -1
    penalty = dapo_overlong_penalty(lengths, max_length=20, cache_length=4)
    torch.testing.assert_close(penalty, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]), atol=1e-7, rtol=0)
    # no cache zone: a hard step after L_max
    hard = dapo_overlong_penalty(lengths, max_length=20, cache_length=0)
    torch.testing.assert_close(hard, torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0]), atol=0, rtol=0)
    with pytest.raises(ValueError):
        dapo_overlong_penalty(lengths, max_length=20, cache_length=21)


def test_dapo_overlong_penalty_keeps_float64_lengths():
    # The length reward's path: float64 in, float64 out. L_max 19, L_cache 3: soft zone from 16;
    # 17 -> (16 - 17) / 3 = -1/3 exactly in float64 (float32 would give -0.33333334).
    penalty = dapo_overlong_penalty(torch.tensor([17.0], dtype=torch.float64), max_length=19, cache_length=3)
    assert penalty.dtype == torch.float64 and float(penalty[0]) == -1 / 3


def test_dapo_dynamic_sampling_drops_groups_whose_rewards_all_agree():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 3.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    keep = dapo_dynamic_sampling_keep(rewards, groups)
    assert keep.tolist() == [True, True, True, True, False, False, False]


# ---------------------------------------------------------------------------------------------
# Unscored samples (NaN rewards)

# Group 0: rewards 1, 0 and two unscored samples; group 1: 3, 5 and one unscored sample.
UNSCORED_REWARDS = torch.tensor([1.0, 0.0, NAN, NAN, 3.0, NAN, 5.0], dtype=F64)
UNSCORED_GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1])
UNSCORED_MASK = torch.ones(7, 2, dtype=torch.bool)


def _unscored(name, **params):
    advantages, metrics = get_advantage(name).fn(
        AdvantageInputs(rewards=UNSCORED_REWARDS, mask=UNSCORED_MASK, group_ids=UNSCORED_GROUPS), **params
    )
    torch.testing.assert_close(advantages[:, 0], advantages[:, 1], atol=0, rtol=0)
    return advantages[:, 0], metrics


def test_unscored_rewards_are_left_out_of_group_norm():
    advantages, metrics = _unscored("group_norm")
    # group 0 scored [1, 0]: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = sqrt(0.5) = 0.70711
    #   A = +-0.5 / (0.70711 + 1e-6) = +-0.70711 (filling the NaNs with the mean gave +-0.8660)
    # group 1 scored [3, 5]: mean 4, std sqrt((1 + 1) / 1) = sqrt(2): A = +-1 / (1.41421 + 1e-6)
    a, b = 0.5 / (math.sqrt(0.5) + EPS), 1.0 / (math.sqrt(2.0) + EPS)
    expected = torch.tensor([a, -a, 0.0, 0.0, -b, 0.0, b], dtype=F64)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)
    assert a == pytest.approx(0.70711, abs=1e-5)
    # no group's scored rewards all agree
    assert metrics["advantage/uniform_group_sample_frac"] == 0.0
    assert all(math.isfinite(value) for value in metrics.values())


def test_unscored_rewards_are_left_out_of_rloo_and_mean_centering():
    advantages, _ = _unscored("rloo")
    # group 0: 1 - 0 = 1, 0 - 1 = -1; group 1: 3 - 5 = -2, 5 - 3 = 2; unscored 0
    expected = torch.tensor([1.0, -1.0, 0.0, 0.0, -2.0, 0.0, 2.0], dtype=F64)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)
    centered, _ = _unscored("group_mean_centered")
    # R - scored group mean: 1 - 0.5, 0 - 0.5, 3 - 4, 5 - 4
    torch.testing.assert_close(centered, torch.tensor([0.5, -0.5, 0.0, 0.0, -1.0, 0.0, 1.0], dtype=F64), atol=1e-12, rtol=0)


def test_unscored_rewards_are_left_out_of_the_batch_std():
    advantages, _ = _unscored("group_norm", std_scale="batch")
    # scored rewards 1, 0, 3, 5: mean 2.25; squared deviations 1.5625 + 5.0625 + 0.5625 + 7.5625
    # = 14.75; unbiased var 14.75 / 3; A = (R - group mean) / (sqrt(14.75 / 3) + eps)
    std = math.sqrt(14.75 / 3) + EPS
    expected = torch.tensor([0.5 / std, -0.5 / std, 0.0, 0.0, -1.0 / std, 0.0, 1.0 / std], dtype=F64)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)


def test_a_group_with_one_or_no_scored_sample_gets_zero_advantage():
    mask = torch.ones(4, 1, dtype=torch.bool)
    rewards = torch.tensor([2.0, NAN, NAN, NAN], dtype=F64)
    for name in ("group_norm", "group_mean_centered", "rloo"):
        advantages, metrics = get_advantage(name).fn(
            AdvantageInputs(rewards=rewards, mask=mask, group_ids=torch.tensor([0, 0, 1, 1]))
        )
        assert torch.equal(advantages, torch.zeros(4, 1, dtype=F64)), name
        assert all(math.isfinite(value) for value in metrics.values())


def test_gae_gives_unscored_rows_zero_advantage_and_their_own_values_as_targets():
    spec = get_advantage("gae")
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    values = torch.tensor([[0.5, 0.25, 9.0], [0.3, 0.2, 0.1], [0.0, 0.0, 0.0]], dtype=F64)
    tensors = dict(rewards=torch.tensor([1.0, NAN, 2.0], dtype=F64), mask=mask, values=values,
                   gammas=torch.ones(3, 3, dtype=F64), lambdas=torch.ones(3, 3, dtype=F64))  # fmt: skip
    advantages, metrics = spec.fn(AdvantageInputs(**tensors))
    # gamma = lambda = 1: A_t = future reward - V_t; row 0: [0.5, 0.75]; row 1 unscored; row 2: [2]
    expected = torch.tensor([[0.5, 0.75, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)
    returns, _ = spec.value_targets(AdvantageInputs(**tensors))
    expected_returns = torch.tensor([[1.0, 1.0, 0.0], [0.3, 0.2, 0.1], [2.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(returns, expected_returns, atol=1e-12, rtol=0)
    assert all(math.isfinite(value) for value in metrics.values())
    # whitening: statistics over the scored rows' tokens 0.5, 0.75, 2 only; the unscored row stays 0
    whitened, _ = spec.fn(AdvantageInputs(**tensors), whiten=True)
    scored = whitened[torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)]
    assert float(scored.mean()) == pytest.approx(0.0, abs=1e-12)
    assert float(scored.std()) == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(whitened[1], torch.zeros(3, dtype=F64))


def test_gae_token_rewards_with_a_nan_mark_the_row_unscored():
    spec = get_advantage("gae")
    mask = torch.tensor([[1, 1], [1, 1]], dtype=torch.bool)
    rewards = torch.tensor([[0.0, 1.0], [0.0, NAN]], dtype=F64)
    advantages, _ = spec.fn(AdvantageInputs(rewards=rewards, mask=mask, values=torch.zeros(2, 2, dtype=F64),
                                            gammas=torch.ones(2, 2, dtype=F64), lambdas=torch.ones(2, 2, dtype=F64)))  # fmt: skip
    torch.testing.assert_close(advantages, torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=F64), atol=0, rtol=0)


def test_dapo_dynamic_sampling_keeps_the_scored_samples_of_informative_groups():
    # group 0: scored 1, 0 (informative) plus two unscored; group 1: scored 1, 1 (uniform)
    rewards = torch.tensor([1.0, 0.0, NAN, NAN, 1.0, 1.0, NAN])
    keep = dapo_dynamic_sampling_keep(rewards, torch.tensor([0, 0, 0, 0, 1, 1, 1]))
    assert keep.tolist() == [True, True, False, False, False, False, False]
