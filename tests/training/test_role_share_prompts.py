"""``train.share_prompts`` in a whole arm: the pipeline's π_old and reference log-probs are packed
per prompt like the learner's, the sampler/learner parity holds, and the arm trains."""

from __future__ import annotations

import math

import torch

from polyrl.modeling.logprobs import token_logprobs
from tests.training.learner_helpers import built, changed_fraction, first_batch, snapshot


def test_arm_with_shared_prompts_keeps_parity_and_trains(tmp_path, tiny_experiment):
    # Two optimizer passes per batch: π_old comes from the pipeline's own forward, not the update's.
    config = tiny_experiment(train={"steps": 2, "kl_coef": 0.05, "share_prompts": True, "updates_per_batch": 2})
    with built(tmp_path, config) as arm:
        assert arm.learner.settings.share_prompts and arm.pipeline.context.share_prompts
        _, _, batch = first_batch(arm)
        # 4 prompts × 4 samples: the learner's packed forward scores what the engine sampled.
        shared, _ = token_logprobs(arm.learner.policy, batch.packed, share_prompts=True)
        per_row, _ = token_logprobs(arm.learner.policy, batch.packed)
        assert torch.allclose(shared, per_row, atol=1e-5, rtol=0)
        assert torch.allclose(batch.old_logprobs, per_row, atol=1e-5, rtol=0)
        assert torch.allclose(batch.ref_logprobs, per_row, atol=1e-5, rtol=0)  # the reference is the policy before any step
        before = snapshot(arm.learner.policy)
        loop = arm.loop(printer=lambda _line: None)
        metrics = [loop.step() for _ in range(2)]
        assert all(math.isfinite(m["actor/loss"]) for m in metrics)
        assert metrics[0]["rollout/logprob_gap"] < 1e-4  # sampler vs π_old, both fp32
        assert metrics[1]["actor/kl"] > 0  # the policy moved away from the reference
        assert changed_fraction(before, arm.learner.policy) > 0.5
