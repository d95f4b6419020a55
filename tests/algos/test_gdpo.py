"""GDPO (Liu et al., arXiv 2601.05242): each reward normalised within its group, weighted, summed,
then normalised over the batch (polyrl/algos/advantages/gdpo.py). Values computed by hand; the
reference implementations' conventions (TRL's normalize_then_sum, the authors' verl version)
rewritten here from their description, on the same tensors."""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.algos.advantages import AdvantageInputs, get_advantage
from polyrl.algos.advantages.gdpo import gdpo_advantages, gdpo_sequence_advantages
from polyrl.config.schema import ConfigError, resolve_arms

R2 = math.sqrt(2) / 2  # 0.70711: (1 - 0.5) / std(0, 1), the unbiased std of (0, 1) being 1/sqrt(2)


def test_the_papers_example_two_reward_combinations_the_sum_ties_and_gdpo_separates():
    # Two binary rewards (correct, format), two samples per prompt.
    # Prompt 0: samples score (0, 0) and (0, 1): totals (0, 1).
    # Prompt 1: samples score (0, 0) and (1, 1): totals (0, 2); its second sample passed both checks.
    components = torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    group_ids = torch.tensor([0, 0, 1, 1])
    mask = torch.ones(4, 3)
    totals = components.sum(-1)

    # GRPO on the totals: (0, 1) -> mean 0.5, std 0.7071 -> (-0.7071, +0.7071);
    # (0, 2) -> mean 1, std 1.4142 -> (-0.7071, +0.7071): the same advantages.
    grpo, _ = get_advantage("group_norm").fn(AdvantageInputs(totals, mask, group_ids))
    assert torch.allclose(grpo[:, 0], torch.tensor([-R2, R2, -R2, R2]), atol=1e-5)

    # GDPO, each reward in its group: prompt 0: correct constant -> 0, format (0, 1) -> (-0.7071, 0.7071);
    # sum (-0.7071, 0.7071). Prompt 1: both rewards (0, 1) -> (-0.7071, 0.7071) each; sum (-1.4142, 1.4142).
    # Batch: mean 0, unbiased std sqrt((0.5 + 0.5 + 2 + 2) / 3) = sqrt(5/3) = 1.2910
    # -> (-0.5477, 0.5477, -1.0954, 1.0954).
    advantages, per_reward, summed, scored = gdpo_sequence_advantages(components, [1.0, 1.0], group_ids)
    assert torch.allclose(summed, torch.tensor([-R2, R2, -2 * R2, 2 * R2]), atol=1e-5)
    assert torch.allclose(advantages, torch.tensor([-0.5477226, 0.5477226, -1.0954451, 1.0954451]), atol=1e-5)
    assert per_reward[0, 0] == 0 and per_reward[1, 0] == 0  # constant in its group: exactly 0
    assert scored.all()
    # The sample that passed both checks now gets twice the push of the one that passed one.
    assert advantages[3] == pytest.approx(2 * advantages[1], rel=1e-5)


def test_weights_a_constant_reward_and_an_unscored_sample_by_hand():
    # Two prompts of three samples; rewards r1 (weight 1) and r2 (weight 0.5).
    # Prompt 0: r1 = (1, 0, 0), r2 = (0, 1, 2). Prompt 1: r1 = (1, 1, 1), r2 = (3, None, 1).
    per_module = {"r1": [1.0, 0.0, 0.0, 1.0, 1.0, 1.0], "r2": [0.0, 1.0, 2.0, 3.0, None, 1.0]}
    weights = {"r1": 1.0, "r2": 0.5}
    group_ids = torch.tensor([7, 7, 7, 9, 9, 9])  # ids need not be contiguous
    mask = torch.tensor([[1, 1, 0]] * 6)
    advantages, metrics = gdpo_advantages(per_module, weights, group_ids, mask)

    # Prompt 0, r1 (1, 0, 0): mean 1/3, unbiased std sqrt((4/9 + 1/9 + 1/9) / 2) = 1/sqrt(3)
    #   -> (2/sqrt(3), -1/sqrt(3), -1/sqrt(3)) = (1.1547, -0.5774, -0.5774).
    # Prompt 0, r2 (0, 1, 2): mean 1, std 1 -> (-1, 0, 1); times 0.5 -> (-0.5, 0, 0.5).
    #   sum: (0.6547, -0.5774, -0.0774).
    # Prompt 1: sample 2 is unscored (r2 None): out of every statistic, advantage 0.
    #   r1 (1, ., 1): constant -> 0. r2 (3, ., 1): mean 2, std sqrt(2) -> (0.7071, -0.7071); times 0.5
    #   -> (0.3536, -0.3536).
    # Batch over the 5 scored: mean 0; unbiased std sqrt((0.4286 + 0.3333 + 0.0060 + 0.125 + 0.125) / 4)
    #   = sqrt(1.01795 / 4) = 0.50447 -> (1.2978, -1.1445, -0.1533, 0.7008, 0, -0.7008).
    expected = torch.tensor([1.2978056, -1.1444750, -0.1533306, 0.7008450, 0.0, -0.7008450])
    assert torch.allclose(advantages[:, 0], expected, atol=1e-5)
    assert torch.equal(advantages[:, 2], torch.zeros(6))  # off the response
    assert advantages[4].abs().sum() == 0
    # r1's group-normalised term over the scored: (1.1547, -0.5774, -0.5774, 0, 0): std sqrt(2/4) = 0.7071.
    # r2's: (-1, 0, 1, 0.7071, -0.7071): std sqrt(3/4) = 0.8660. r1 is constant in 1 group of 2.
    assert metrics["advantage/r1/std"] == pytest.approx(R2, abs=1e-5)
    assert metrics["advantage/r2/std"] == pytest.approx(math.sqrt(0.75), abs=1e-5)
    assert metrics["advantage/r1/constant_group_share"] == 0.5
    assert metrics["advantage/r2/constant_group_share"] == 0.0
    assert metrics["advantage/uniform_group_sample_frac"] == 0.0  # r2 separates prompt 1
    assert metrics["advantage/gdpo_sum_std"] == pytest.approx(0.5044673, abs=1e-5)


def test_a_group_no_reward_separates_gets_zero_and_counts_as_uniform():
    # Prompt 0: both rewards constant -> 0 before the batch step; prompt 1: r1 (0, 1) -> (-0.7071, 0.7071).
    # Batch over (0, 0, -0.7071, 0.7071): mean 0, std sqrt(1/3) = 0.5774 -> (0, 0, -1.2247, 1.2247).
    per_module = {"a": [1.0, 1.0, 0.0, 1.0], "b": [0.3, 0.3, 0.5, 0.5]}
    advantages, metrics = gdpo_advantages(per_module, {"a": 1.0, "b": 1.0}, torch.tensor([0, 0, 1, 1]), torch.ones(4, 2))
    assert torch.allclose(advantages[:, 0], torch.tensor([0.0, 0.0, -1.2247449, 1.2247449]), atol=1e-5)
    assert metrics["advantage/uniform_group_sample_frac"] == 0.5
    assert metrics["advantage/b/constant_group_share"] == 1.0


def _trl_normalize_then_sum(components: torch.Tensor, weights: list[float], generations: int) -> torch.Tensor:
    """TRL's GRPOTrainer with multi_objective_aggregation='normalize_then_sum', as documented there:
    per reward, within each group of ``generations`` consecutive samples, (r - mean) / (std + 1e-4)
    with the unbiased std; weighted sum; then (x - mean) / (std + 1e-4) over the batch, unbiased."""
    grouped = components.view(-1, generations, components.shape[-1])
    per_reward = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
    summed = (per_reward.view(-1, components.shape[-1]) * torch.tensor(weights)).sum(-1)
    return (summed - summed.mean()) / (summed.std() + 1e-4)


def _verl_gdpo(components: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The authors' verl version (NVlabs/GDPO, verl-GDPO): per reward verl's GRPO outcome advantage
    ((r - mean) / (std + 1e-6), unbiased std), summed WITHOUT weights, then masked_whiten over the
    response tokens: (x - mean) * rsqrt(var + 1e-8), var unbiased over tokens."""
    summed = torch.zeros(len(components))
    for k in range(components.shape[-1]):
        for g in group_ids.unique():
            rows = group_ids == g
            r = components[rows, k]
            summed[rows] += (r - r.mean()) / (r.std() + 1e-6)
    tokens = summed[:, None].expand(mask.shape)
    m = mask.bool()
    mean = tokens[m].mean()
    var = ((tokens - mean)[m] ** 2).sum() / (m.sum() - 1)
    return ((tokens - mean) * torch.rsqrt(var + 1e-8)) * mask


def test_parity_with_trls_normalize_then_sum_at_its_epsilon():
    # Same tensors, polyrl with eps=1e-4 (TRL's) against TRL's convention: equal to float32 rounding.
    generator = torch.Generator().manual_seed(0)
    components = torch.rand(24, 3, generator=generator)  # 6 prompts x 4 samples, 3 rewards
    components[:4, 1] = 1.0  # a reward constant in a group: 0 in both (r - mean is exactly 0)
    weights = [1.0, 0.3, 2.0]
    group_ids = torch.arange(6).repeat_interleave(4)
    ours, *_ = gdpo_sequence_advantages(components, weights, group_ids, eps=1e-4)
    assert torch.allclose(ours, _trl_normalize_then_sum(components, weights, 4), atol=1e-5)
    # At polyrl's default eps (1e-6) the difference is the epsilon's alone: small, not zero.
    default, *_ = gdpo_sequence_advantages(components, weights, group_ids)
    assert 0 < (default - ours).abs().max() < 1e-2


def test_parity_with_the_authors_verl_version_when_responses_have_equal_lengths():
    # verl whitens over tokens: with equal response lengths the token statistics are the sample ones
    # (the unbiased divisors differ: N*L - 1 against N - 1, a factor sqrt((N*L - 1) / (L*(N - 1))) on the std).
    generator = torch.Generator().manual_seed(1)
    components = torch.rand(8, 2, generator=generator)
    group_ids = torch.arange(2).repeat_interleave(4)
    equal = torch.ones(8, 5)
    ours, *_ = gdpo_sequence_advantages(components, [1.0, 1.0], group_ids)
    verl = _verl_gdpo(components, group_ids, equal)[:, 0]
    n, length = 8, 5
    assert torch.allclose(ours * math.sqrt((n * length - 1) / (length * (n - 1))), verl, atol=1e-4)
    # Unequal lengths within a group: the longer responses weigh more in verl's batch mean, so the
    # two part by more than a common scale (a group sums to 0, so lengths shared by a whole group
    # would only rescale).
    unequal = torch.ones(8, 5)
    unequal[[0, 1, 4], 2:] = 0
    verl_unequal = _verl_gdpo(components, group_ids, unequal)
    ratio = verl_unequal[:, 0] / ours
    assert ratio.max() - ratio.min() > 1e-2


def _experiment(**overrides):
    config = {
        "name": "gdpo",
        "model": {"path": "/models/m"},
        "rewards": [{"module": "length"}, {"module": "format", "params": {"pattern": "a"}}],
        "advantage": {"reward_aggregation": "gdpo"},
    }
    for key, value in overrides.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


def test_config_accepts_gdpo_with_two_rewards_and_group_norm():
    cfg = resolve_arms(_experiment())["main"]
    assert cfg.advantage.reward_aggregation == "gdpo"
    assert resolve_arms(_experiment(advantage={"reward_aggregation": "sum"}))["main"].advantage.reward_aggregation == "sum"
    assert resolve_arms({"name": "x", "model": {"path": "/m"}})["main"].advantage.reward_aggregation == "sum"  # default


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"rewards": [{"module": "length"}]}, "the run has 1 reward"),
        ({"objective": {"name": "ppo"}}, "the advantage estimator is 'gae'"),
        ({"objective": {"name": "dr_grpo"}}, "the advantage estimator is 'group_mean_centered'"),
        ({"advantage": {"reward_aggregation": "gdpo", "params": {"use_std": False}}}, "turn off the group std"),
        ({"advantage": {"reward_aggregation": "gdpo", "params": {"std_scale": "batch"}}}, "turn off the group std"),
        ({"advantage": {"reward_aggregation": "gdpo", "dynamic_sampling": {"enabled": True}}}, "dynamic_sampling"),
        ({"advantage": {"reward_aggregation": "gdpo", "overlong": {"mode": "soft_punishment"}}}, "soft_punishment"),
    ],
)
def test_config_refuses_gdpo_where_it_would_not_act(overrides, says):
    with pytest.raises(ConfigError) as error:
        resolve_arms(_experiment(**overrides))
    text = str(error.value)
    assert "advantage.reward_aggregation" in text and says in text, text
    assert "allowed here: reward_aggregation: sum" in text


def test_config_refuses_an_unknown_aggregation_naming_the_allowed_ones():
    with pytest.raises(ConfigError) as error:
        resolve_arms(_experiment(advantage={"reward_aggregation": "mean"}))
    assert "advantage.reward_aggregation" in str(error.value) and "'sum'" in str(error.value)
    assert "'gdpo'" in str(error.value)


# --- through the trainer: each reward's raw scores reach the advantage ------------------------------


def _two_reward_experiment(tiny_experiment, **overrides):
    return tiny_experiment(
        rewards=[
            {"module": "length", "params": {"unit": "chars"}},
            {"module": "format", "params": {"pattern": "a", "match": "search"}},
        ],
        advantage={"reward_aggregation": "gdpo"},
        **overrides,
    )


@pytest.mark.slow
def test_the_pipeline_takes_each_rewards_scores_and_separates_what_the_total_ties(tmp_path, tiny_experiment):
    from polyrl.policies.paths import resolve_policy_path
    from tests.training.learner_helpers import ScriptedEngine, built, make_config

    # Rewards: length (characters / 100) and format (1 when the text holds an "a").
    # Prompt 0: "bb" (0.02, 0), "ab" (0.02, 1): totals (0.02, 1.02). Prompt 1: "b" (0.01, 0), "abc" (0.03, 1):
    # totals (0.01, 1.03). The sum's group_norm gives (-0.7071, 0.7071) to both prompts.
    # GDPO: prompt 0: length constant -> 0, format -> (-0.7071, 0.7071); prompt 1: both rewards
    # (-0.7071, 0.7071), sum (-1.4142, 1.4142); batch std sqrt(5/3) -> (-0.5477, 0.5477, -1.0954, 1.0954).
    config = _two_reward_experiment(tiny_experiment, rollout={"prompts_per_step": 2, "samples_per_prompt": 2})
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_policy_path(make_config(config).model)))
    engine = ScriptedEngine(tokenizer, [[["bb", "ab"], ["b", "abc"]]])
    with built(tmp_path, config, engine=engine) as arm:
        collected = arm.collector.collect(1)
        batch = arm.pipeline.run(collected.rollout, collected.scores)
    first_token = batch.advantages[torch.arange(4), batch.packed.response_mask.float().argmax(-1)]
    # atol 1e-4: the length reward's group std is 0.0141, so eps (1e-6) moves its term by 7e-5.
    torch.testing.assert_close(first_token, torch.tensor([-0.5477226, 0.5477226, -1.0954451, 1.0954451]), atol=1e-4, rtol=0)
    assert batch.metrics["advantage/length/constant_group_share"] == 0.5
    assert batch.metrics["advantage/format/constant_group_share"] == 0.0


@pytest.mark.slow
def test_a_few_training_steps_with_two_rewards_under_gdpo(tmp_path, tiny_experiment):
    from tests.training.learner_helpers import built, changed_fraction, snapshot

    config = _two_reward_experiment(tiny_experiment, train={"steps": 3, "learning_rate": 1e-2, "micro_batch_size": 8})
    with built(tmp_path, config) as arm:
        before = snapshot(arm.learner.policy)
        history = arm.loop().run()
        assert changed_fraction(before, arm.learner.policy) > 0
    assert len(history) == 3
    assert all(math.isfinite(h["actor/loss"]) for h in history)
    # GDPO ran (its per-reward statistics are logged), not the sum.
    assert all("advantage/length/std" in h and "advantage/format/constant_group_share" in h for h in history)
