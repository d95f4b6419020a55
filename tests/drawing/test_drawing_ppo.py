"""A short PPO run with GAE on the drawing task: image-marked tokens get the image γ/λ in GAE."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from polyrl.config.schema import resolve_arms
from polyrl.tasks import drawing
from polyrl.trainer.build_arm import build_arm
from polyrl.trainer.pipeline import BatchPipeline


def drawing_ppo_config(tmp_path, policy_dir, **modalities) -> dict:
    return {
        "name": "draw_ppo",
        "seed": 0,
        "model": {"path": str(policy_dir)},
        "data": {"source": str(drawing.DATA_DIR)},
        "rollout": {"engine": "hf", "prompts_per_step": 4, "samples_per_prompt": 4, "max_tokens": 64},
        "objective": {"name": "ppo"},
        "rewards": [{"module": "drawing"}],
        "modalities": modalities or {"image": {"gamma": 0.85, "lam": 0.8}, "text": {"gamma": 0.95, "lam": 0.9}},
        "train": {"steps": 2, "learning_rate": 1e-3, "micro_batch_size": 16, "value": {"learning_rate": 1e-3}},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs"), "every": 10},
    }


@pytest.mark.slow
def test_ppo_gae_gives_image_tokens_the_image_setting(tmp_path, drawing_policy_dir):
    config = resolve_arms(drawing_ppo_config(tmp_path, drawing_policy_dir))["main"]
    arm = build_arm(config, arm="main", arm_dir=tmp_path / "runs" / "main")
    seen: list[dict] = []
    try:
        context = arm.pipeline.context
        assert context.estimator.name == "gae" and arm.critic is not None
        fn = context.estimator.fn

        def spy(inputs, **params):  # records what GAE receives, then runs the real estimator
            seen[-1].update(gammas=inputs.gammas.clone(), lambdas=inputs.lambdas.clone(), mask=inputs.mask.clone())
            return fn(inputs, **params)

        def record(batch, context):  # a first pipeline stage that records the rollout's token modalities
            seen.append({"modalities": [c.completion_token_modalities for c in batch.rollout.completions]})
            return batch

        arm.pipeline = BatchPipeline(
            dataclasses.replace(context, estimator=dataclasses.replace(context.estimator, fn=spy)),
            stages=(record, *arm.pipeline.stages),
        )
        policy = arm.learner.policy
        policy_before = {n: p.detach().clone() for n, p in policy.named_parameters()}
        history = arm.loop().run()
    finally:
        arm.close()

    assert len(seen) == 2 and all("gammas" in s for s in seen)
    image_tokens = 0
    for step in seen:
        for row, modalities in enumerate(step["modalities"]):
            for t, modality in enumerate(modalities):
                assert step["mask"][row, t]
                want = (0.85, 0.8) if modality == "image" else (0.95, 0.9)
                assert (float(step["gammas"][row, t]), float(step["lambdas"][row, t])) == pytest.approx(want, abs=1e-7)
            image_tokens += modalities.count("image")
    # 32 completions, most of them a well-formed 9-cell grid
    assert image_tokens >= 9 * 16
    assert all(math.isfinite(h["actor/loss"]) and math.isfinite(h["value/loss"]) for h in history)
    assert any(not torch.equal(policy_before[n], p) for n, p in policy.named_parameters())
