"""The batch pipeline alone: stages called one by one on hand-made batches, and the list run
without any model (one on-policy step, no reference, no critic). Values by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from polyrl.algos.advantages import get_advantage
from polyrl.config.schema import ExperimentConfig
from polyrl.core.types import Completion, PromptSample
from polyrl.rollout.batches import LearnerBatch, Rollout, Scores
from polyrl.trainer.pipeline import (
    STAGES,
    BatchPipeline,
    PipelineBatch,
    PipelineContext,
    advantage_stats,
    fold_kl_into_rewards,
    loss_mask,
    overlong_penalty,
    pack,
    run_pipeline,
    sequence_rewards,
    truncated_importance_sampling,
)


def _completion(n_tokens: int, *, truncated: bool = False) -> Completion:
    ids = list(range(5, 5 + n_tokens))
    return Completion(
        prompt_ids=[1, 2],
        completion_ids=ids,
        text="x" * n_tokens,
        sampling_logprobs=[-1.0] * n_tokens,
        finish_reason="length" if truncated else "stop",
    )


def _rollout(lengths, truncated=None, groups=None) -> Rollout:
    truncated = truncated or [False] * len(lengths)
    completions = [_completion(n, truncated=t) for n, t in zip(lengths, truncated)]
    return Rollout([PromptSample(prompt="p")] * len(lengths), completions, torch.tensor(groups or [0] * len(lengths)))


def _context(**overrides) -> PipelineContext:
    estimator = get_advantage("group_norm")
    config = ExperimentConfig(name="t", advantage={"overlong": overrides.pop("overlong", {})})
    return PipelineContext(
        estimator=estimator,
        estimator_params=dict(estimator.default_params),
        pad_token_id=0,
        overlong=config.advantage.overlong,
        modalities=config.modalities,
        max_tokens=8,
        **overrides,
    )


def _through(batch: PipelineBatch, ctx: PipelineContext, *stages) -> PipelineBatch:
    for stage in stages:
        batch = stage(batch, ctx)
    return batch


def test_the_model_free_stage_list_gives_group_normalised_advantages_on_trainable_tokens():
    rollout = _rollout([2, 3, 1, 2], groups=[0, 0, 1, 1])
    batch = run_pipeline(rollout, Scores([1.0, 0.0, None, 0.5], {}), _context())
    assert isinstance(batch, LearnerBatch) and batch.old_logprobs is None and batch.ref_logprobs is None
    # group 0: rewards 1, 0 → mean 0.5, unbiased std 0.7071 → ±0.7071 on each response token;
    # group 1: one scored reward (0.5) alone → 0; the unscored row gets 0 and leaves the loss.
    assert batch.advantages[0, :2].tolist() == pytest.approx([0.70711] * 2, abs=1e-4)
    assert batch.advantages[1, :3].tolist() == pytest.approx([-0.70711] * 3, abs=1e-4)
    assert batch.loss_mask.sum(-1).tolist() == [2, 3, 0, 2]
    assert torch.count_nonzero(batch.advantages[2]) == 0 and torch.count_nonzero(batch.advantages[0, 2:]) == 0
    assert batch.metrics["reward/unscored_samples"] == 1


def test_adding_a_stage_is_adding_a_function_to_the_list():
    def double(batch: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
        return dataclasses.replace(batch, advantages=batch.advantages * 2)

    rollout, scores = _rollout([2, 2]), Scores([1.0, 0.0], {})
    plain = BatchPipeline(_context()).run(rollout, scores)
    doubled = BatchPipeline(_context(), stages=(*STAGES, double)).run(rollout, scores)
    torch.testing.assert_close(doubled.advantages, plain.advantages * 2, atol=0, rtol=0)


def test_soft_overlong_punishment_shapes_the_reward_by_length():
    ctx = _context(overlong={"mode": "soft_punishment", "cache_length": 4, "penalty_weight": 1.0})
    b = _through(PipelineBatch(_rollout([2, 6, 8]), Scores([1.0, 1.0, 1.0], {})), ctx, pack, sequence_rewards, overlong_penalty)
    # max 8, cache 4 → soft start 4: lengths 2, 6, 8 → 0, (4-6)/4 = -0.5, (4-8)/4 = -1
    assert b.rewards.tolist() == pytest.approx([1.0, 0.5, 0.0])
    assert b.metrics["reward/overlong_penalty_mean"] == pytest.approx(-0.5)


def test_mask_truncated_takes_truncated_rows_out_of_the_loss_but_not_out_of_the_rewards():
    ctx = _context(overlong={"mode": "mask_truncated"})
    b = _through(
        PipelineBatch(_rollout([2, 3], truncated=[False, True]), Scores([1.0, 0.0], {})),
        ctx,
        pack,
        sequence_rewards,
        overlong_penalty,
        loss_mask,
    )
    assert b.loss_mask.sum(-1).tolist() == [2, 0] and b.rewards.tolist() == [1.0, 0.0]
    assert b.metrics["rollout/masked_truncated"] == 1


def test_kl_in_reward_goes_through_algos_kl_in_reward():
    ctx = _context(kl_in_reward=True, kl_coef=0.1, kl_estimator="k1")
    b = _through(PipelineBatch(_rollout([2]), Scores([1.0], {})), ctx, pack, sequence_rewards)
    b = dataclasses.replace(b, old_logprobs=torch.tensor([[-1.0, -2.0]]), ref_logprobs=torch.tensor([[-1.5, -1.0]]))
    shaped = fold_kl_into_rewards(b, ctx)
    # k1 = old - ref = 0.5, -1.0; reward 1 on the last token: -0.1×0.5 = -0.05, 1 - 0.1×(-1) = 1.1
    assert shaped.token_rewards[0].tolist() == pytest.approx([-0.05, 1.1], abs=1e-7)
    assert shaped.metrics["kl_reward/kl_mean"] == pytest.approx(-0.25)


def test_truncated_importance_sampling_caps_the_learner_over_sampler_ratio():
    ctx = _context(tis_cap=1.5)
    b = _through(PipelineBatch(_rollout([2]), Scores([1.0], {})), ctx, pack, sequence_rewards, loss_mask)
    b = dataclasses.replace(b, old_logprobs=torch.tensor([[-1.0, -0.5]]), advantages=torch.tensor([[2.0, 2.0]]))
    weighted = truncated_importance_sampling(b, ctx)
    # sampler log-probs -1: ratios e^0 = 1 and e^0.5 = 1.65, capped at 1.5 → advantages 2, 3; mean weight 1.25
    assert weighted.advantages[0].tolist() == pytest.approx([2.0, 3.0])
    assert weighted.metrics["rollout/tis_weight_mean"] == pytest.approx(1.25)


def test_advantage_stats_cover_trainable_tokens_only():
    b = PipelineBatch(
        _rollout([2, 2]),
        Scores([0.0, 0.0], {}),
        advantages=torch.tensor([[1.0, -1.0], [3.0, 100.0]]),
        loss_mask=torch.tensor([[True, True], [True, False]]),
    )
    m = advantage_stats(b, _context()).metrics
    # 1, -1, 3: mean 1, population std sqrt(8/3) = 1.63299, max |z| = 2 / 1.63299 = 1.22474
    assert (m["advantage/mean"], m["advantage/std"], m["advantage/max_abs_z"]) == pytest.approx(
        (1.0, math.sqrt(8 / 3), 1.22474), abs=1e-5
    )
