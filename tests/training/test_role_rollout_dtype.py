"""``rollout.dtype``: the engine samples in its own dtype (bf16 under an fp32 learner), the weight
sync pushes that dtype every step, and the learner keeps fp32."""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.config.schema import ConfigError, resolve_arms
from polyrl.modeling.packing import base_attention
from tests.training.learner_helpers import built, changed_fraction, snapshot

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm]


def test_rollout_dtype_defaults_to_model_dtype_and_is_validated():
    arm = resolve_arms({"name": "x", "model": {"dtype": "bfloat16"}})["main"]
    assert arm.rollout.dtype is None and arm.sampling_dtype == "bfloat16"
    arm = resolve_arms({"name": "x", "rollout": {"dtype": "bfloat16"}})["main"]
    assert arm.model.dtype == "float32" and arm.sampling_dtype == "bfloat16"
    with pytest.raises(ConfigError) as refused:
        resolve_arms({"name": "x", "rollout": {"dtype": "float16"}})
    assert "rollout.dtype" in str(refused.value) and "'bfloat16'" in str(refused.value)


def test_hf_engine_loads_the_rollout_dtype_and_the_learner_stays_fp32(tmp_path, tiny_experiment):
    config = tiny_experiment(rollout={"dtype": "bfloat16"}, train={"steps": 1})
    with built(tmp_path, config) as arm:
        assert arm.collector.engine.model.dtype == torch.bfloat16
        assert {p.dtype for p in arm.learner.policy.parameters()} == {torch.float32}
        assert base_attention(arm.learner.policy) == "sdpa"  # an fp32 learner keeps torch's own attention (wrapped padding-free)
        metrics = arm.loop(printer=lambda _line: None).step()
        assert math.isfinite(metrics["actor/loss"])


@pytest.mark.slow
def test_vllm_samples_in_bf16_under_an_fp32_learner_and_stays_in_sync(tmp_path, tiny_experiment):
    config = tiny_experiment(
        rollout={"engine": "vllm", "max_tokens": 24, "dtype": "bfloat16"},
        train={"steps": 3, "learning_rate": 1e-2, "micro_batch_size": 16},
    )
    with built(tmp_path, config) as arm:
        loop = arm.loop(printer=lambda _line: None)
        assert loop.engine_dtype == torch.bfloat16
        pushed: list[set[torch.dtype]] = []
        sync = arm.collector.engine.sync_weights

        def recording_sync(named_tensors):
            named_tensors = list(named_tensors)
            pushed.append({tensor.dtype for _, tensor in named_tensors})
            return sync(named_tensors)

        arm.collector.engine.sync_weights = recording_sync
        before = snapshot(arm.learner.policy)
        history = [loop.step() for _ in range(3)]
    assert pushed == [{torch.bfloat16}] * 3
    assert {p.dtype for p in arm.learner.policy.parameters()} == {torch.float32}
    assert changed_fraction(before, arm.learner.policy) > 0.5 and all(math.isfinite(h["actor/loss"]) for h in history)
    # The gap is bf16 rounding of the sampler alone: fp32 sampling gives < 1e-5 here
    # (test_trainer.py), a stale sync at lr 1e-2 gives nats.
    gaps = [h["rollout/logprob_gap"] for h in history]
    assert all(1e-4 < gap < 2e-2 for gap in gaps), gaps


def test_gap_warning_names_bf16_rounding_only_for_a_bf16_sampler():
    from polyrl.config.schema import HealthConfig
    from polyrl.monitoring.health import HealthMonitor

    metrics = {"rollout/logprob_gap": 0.05}
    fp32 = HealthMonitor(HealthConfig()).check(1, dict(metrics))
    bf16 = HealthMonitor(HealthConfig(), sampler_dtype="bfloat16").check(1, dict(metrics))
    assert len(fp32) == 1 and "stale or partial weight sync" in fp32[0] and "rounding" not in fp32[0]
    assert len(bf16) == 1 and "bfloat16 rounding in the sampler" in bf16[0] and "health.max_logprob_gap" in bf16[0]
