"""The learner's metrics do not depend on how a mini-batch is cut into micro-batches: ratio
metrics are ratios of the update's sums, extremes are extremes (before: means over micro-batches)."""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.algos.objectives import get_objective
from polyrl.core.types import Completion
from polyrl.engines.image_prompts import auto_model_class
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.modeling.logprobs import pack_completions
from polyrl.rollout.batches import LearnerBatch

ROWS = [([5, 6], [7, 8, 9, 10]), ([12], [7]), ([12], [8, 9, 10, 11, 12, 13]), ([14, 15, 16], [17, 18, 19]), ([9], [21, 22])]
COMBINED = (
    "ratio_max",
    "ratio_min",
    "pos_loss_share",
    "positive_share",
    "quadrant/high_prob_pos_adv",
    "quadrant/low_prob_neg_adv",
)


def _batch() -> LearnerBatch:
    completions = [
        Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-3.0] * len(c), finish_reason="stop")
        for p, c in ROWS
    ]
    packed = pack_completions(completions, pad_token_id=0)
    generator = torch.Generator().manual_seed(3)
    mask = packed.response_mask
    advantages = torch.randn(mask.shape, generator=generator) * mask
    # π_old off the current policy, so ratios spread and some tokens clip.
    old = (torch.randn(mask.shape, generator=generator) * 0.3 - 4.0) * mask
    return LearnerBatch(packed=packed, old_logprobs=old, advantages=advantages)


def _metrics(policy_dir, micro_batch_size: int) -> dict[str, float]:
    policy = auto_model_class(policy_dir).from_pretrained(str(policy_dir), dtype=torch.float32)
    spec = get_objective("ppo")
    settings = LearnerSettings(
        aggregation="token_mean", objective_params=dict(spec.default_params), micro_batch_size=micro_batch_size
    )
    return PolicyLearner(policy, spec, settings).update(_batch(), 0)


def test_ratio_and_extreme_metrics_are_the_same_for_any_micro_batch_size(random_policy_dir):
    whole, cut = _metrics(random_policy_dir, 8), _metrics(random_policy_dir, 1)
    for name in COMBINED:
        key = name if name.startswith("quadrant/") else f"actor/{name}"
        # Before: ratio_max over 5 one-row micro-batches was the token-weighted mean of the rows' maxima.
        assert math.isclose(whole[key], cut[key], rel_tol=1e-5, abs_tol=1e-6), (key, whole[key], cut[key])
    assert whole["actor/ratio_max"] > whole["actor/ratio_mean"] > whole["actor/ratio_min"]
    assert not any(key.startswith(("parts/", "actor/parts/")) for key in cut)


@pytest.mark.parametrize("micro_batch_size", [2])
def test_the_extremes_are_the_tokens_own(random_policy_dir, micro_batch_size):
    batch = _batch()
    policy = auto_model_class(random_policy_dir).from_pretrained(str(random_policy_dir), dtype=torch.float32)
    from polyrl.modeling.logprobs import token_logprobs

    with torch.no_grad():
        current, _ = token_logprobs(policy.eval(), batch.packed)
    mask = batch.loss_mask.bool()
    ratio = torch.exp(current - batch.old_logprobs)[mask]
    out = _metrics(random_policy_dir, micro_batch_size)
    assert out["actor/ratio_max"] == pytest.approx(float(ratio.max()), rel=1e-5)
    assert out["actor/ratio_min"] == pytest.approx(float(ratio.min()), rel=1e-5)
