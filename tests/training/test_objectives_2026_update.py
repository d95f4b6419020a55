"""One learner update with each 2025-26 objective on the tiny random policy, through the arm's real
collector (HF engine), pipeline and learner: the loss is finite and the parameters move."""

from __future__ import annotations

import math

import pytest
from learner_helpers import built, changed_fraction, snapshot

NEW = ["cispo", "gpg", "sapo", "gmpo", "clip_cov", "kl_cov", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax"]


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW)
def test_one_update_with_each_new_objective_moves_the_policy(tmp_path, tiny_experiment, name):
    # Two updates per batch (two mini-batches): the second one is off-policy, so the clips,
    # gates and covariance selections act on ratios != 1. Wide covariance bands and shares make
    # Clip-Cov / KL-Cov select tokens in this small batch.
    params = {"clip_cov": {"clip_cov_ratio": 0.2, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0}, "kl_cov": {"kl_cov_ratio": 0.2}}
    config = tiny_experiment(
        objective={"name": name, "params": params.get(name, {})},
        rollout={"prompts_per_step": 2, "samples_per_prompt": 4, "max_tokens": 8},
        train={"steps": 1, "learning_rate": 3e-3, "micro_batch_size": 8, "mini_batches": 2},
    )
    with built(tmp_path, config) as arm:
        collected = arm.collector.collect(1)
        batch = arm.pipeline.run(collected.rollout, collected.scores)
        before = snapshot(arm.learner.policy)
        metrics = arm.learner.update(batch, 0)
        moved = changed_fraction(before, arm.learner.policy)
    assert math.isfinite(metrics["actor/loss"])
    assert metrics["actor/optimizer_steps"] == 2
    assert moved > 0.5, f"{name}: only {moved:.1%} of the parameters changed"
    if name in ("clip_cov", "kl_cov"):
        assert metrics["actor/cov/selected_frac"] > 0
    if name == "remax":
        assert "reward/greedy_baseline_mean" in collected.scores.metrics
    if name == "reinforce_pp":
        assert "kl_reward/kl_mean" in batch.metrics  # the k1 KL went into the reward (objective preset)
