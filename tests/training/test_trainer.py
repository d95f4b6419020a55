"""Training end to end on a tiny model: a few real steps, through the real rollout engines.

The reward is the `length` module (len/100 in characters): a random tiny policy can raise it
within a few steps, so "the metric moved where it should" is checkable without a warm model.
"""

from __future__ import annotations

import math

import pytest
import torch
from mlflow.tracking import MlflowClient

from polyrl.config.schema import resolve_arms
from polyrl.tracking.mlflow_runs import ARM_TAG, ExperimentTracker
from polyrl.trainer.build_arm import build_arm

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm]

REQUIRED_METRICS = [
    "reward/mean",
    "reward/length/mean",
    "rollout/response_length/mean",
    "rollout/response_length/clipped_ratio",
    "actor/entropy",
    "actor/clip_frac_low",
    "actor/clip_frac_high",
    "actor/approx_kl",
    "actor/pos_loss_share",
    "actor/positive_share",
    "actor/grad_norm",
    "rollout/logprob_gap",
    *[f"perf/{phase}_s" for phase in ("generate", "score", "advantage", "update", "sync", "log")],
]


def _arm(tmp_path, config_dict, arm="main", logger=None):
    config = resolve_arms(config_dict)[arm]
    return build_arm(config, arm=arm, arm_dir=tmp_path / "runs" / arm, logger=logger)


def _snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _changed(before, model):
    return sum(not torch.equal(before[name], p.detach()) for name, p in model.named_parameters())


def _run(arm):
    try:
        before = _snapshot(arm.learner.policy)
        history = arm.loop().run()
        return before, history
    finally:
        arm.close()


def test_grpo_on_hf_engine_learns_longer_answers_and_logs_every_metric(tmp_path, tiny_experiment):
    config = tiny_experiment(train={"steps": 6, "learning_rate": 1e-2, "micro_batch_size": 8}, rollout={"max_tokens": 24})
    tracker = ExperimentTracker(config["tracking"]["uri"], "tiny")
    parent = tracker.start_parent("tiny")
    logger = tracker.start_arm(parent.run_id, "main")
    arm = _arm(tmp_path, config, logger=logger)
    before, history = _run(arm)

    assert len(history) == 6
    assert all(math.isfinite(h["actor/loss"]) for h in history)
    assert _changed(before, arm.learner.policy) > 0
    first, last = history[0], history[-1]
    # len/100 reward: the policy must learn to write more before it stops.
    assert last["reward/mean"] > first["reward/mean"] + 0.02, (first["reward/mean"], last["reward/mean"])
    assert last["rollout/response_length/mean"] > first["rollout/response_length/mean"]

    client = MlflowClient(config["tracking"]["uri"])
    run = client.get_run(logger.run_id)
    for key in REQUIRED_METRICS:
        steps = [m.step for m in client.get_metric_history(logger.run_id, key)]
        assert steps == [1, 2, 3, 4, 5, 6], (key, steps)
    assert run.data.tags[ARM_TAG] == "main"
    assert run.data.tags["mlflow.parentRunId"] == parent.run_id
    # A sample table at step 1 and every sample_table_every steps.
    artifacts = {a.path for a in client.list_artifacts(logger.run_id, "samples")}
    assert "samples/step_00001.json" in artifacts and "samples/step_00005.json" in artifacts


@pytest.mark.slow
def test_vllm_engine_stays_in_sync_with_the_learner_every_step(tmp_path, tiny_experiment):
    config = tiny_experiment(
        rollout={"engine": "vllm", "max_tokens": 24, "kv_cache_gb": "auto"},
        train={"steps": 4, "learning_rate": 1e-2, "micro_batch_size": 16},
    )
    arm = _arm(tmp_path, config)
    engine, update = arm.collector.engine, arm.learner.update
    released_during_updates = []

    def watched_update(*args, **kwargs):  # the sampler's weights are gone while the learner updates
        released_during_updates.append(engine.released)
        return update(*args, **kwargs)

    arm.learner.update = watched_update
    # rollout.kv_cache_gb auto: 4 x 4 sequences of <= 24 + longest prompt tokens, one 128-token block each,
    # + 1 block vLLM holds back (the fixed 0.25 GiB of the other tests: 2,048 blocks of 128 x 1,024 B for this tiny policy).
    assert engine.llm.llm_engine.vllm_config.cache_config.num_gpu_blocks == 4 * 4 + 1
    before, history = _run(arm)
    assert _changed(before, arm.learner.policy) > 0
    assert released_during_updates == [True] * 4 and not engine.released
    # Weights move a lot at lr 1e-2; a stale engine (or one reloaded from released weights wrongly)
    # would show a gap of nats after step 1.
    gaps = [h["rollout/logprob_gap"] for h in history]
    assert max(gaps) < 1e-3, gaps
    assert history[-1]["reward/mean"] > history[0]["reward/mean"]


def test_ppo_with_gae_trains_a_critic_with_delayed_updates(tmp_path, tiny_experiment):
    config = tiny_experiment(
        objective={"name": "ppo"},
        train={
            "steps": 4,
            "learning_rate": 1e-3,
            "updates_per_batch": 2,
            "mini_batches": 2,
            "value": {"learning_rate": 1e-3, "update_every": 2},
        },
    )
    arm = _arm(tmp_path, config)
    try:
        assert arm.critic is not None and arm.pipeline.context.estimator.name == "gae"
        critic_before = _snapshot(arm.critic.model)
        history = arm.loop().run()
    finally:
        arm.close()
    assert _changed(critic_before, arm.critic.model) > 0
    assert all(math.isfinite(h["value/loss"]) for h in history)
    # 2 passes × 2 mini-batches = 4 policy updates per step, a critic update every 2nd.
    assert [h["value/updates"] for h in history] == [2.0, 2.0, 2.0, 2.0]


def test_dapo_with_dynamic_sampling_overlong_penalty_and_kl(tmp_path, tiny_experiment):
    config = tiny_experiment(
        objective={"name": "dapo"},
        advantage={
            "dynamic_sampling": {"enabled": True, "max_rounds": 2},
            "overlong": {"mode": "soft_punishment", "cache_length": 4},
        },
        train={"steps": 2, "learning_rate": 1e-3, "kl_coef": 0.05},
        rewards=[{"module": "length", "params": {"unit": "chars", "target": 10}}],
    )
    arm = _arm(tmp_path, config)
    before, history = _run(arm)
    assert _changed(before, arm.learner.policy) > 0
    for h in history:
        assert math.isfinite(h["actor/loss"])
        assert h["rollout/dynamic_sampling_rounds"] >= 1
        assert h["reward/overlong_penalty_mean"] <= 0
        assert h["actor/kl"] >= 0 and "actor/ref_kl" in h


def test_unscored_samples_get_zero_advantage_and_are_counted(tmp_path, tiny_experiment):
    # `accuracy` returns None for rows without an answer: every sample is unscored here.
    config = tiny_experiment(
        data={"source": str(_no_answer_data(tmp_path))},
        rewards=[{"module": "accuracy", "allow_unscored": True}],
        train={"steps": 1},
    )
    arm = _arm(tmp_path, config)
    try:
        collected = arm.collector.collect(1)
        rollout, scores = collected.rollout, collected.scores
        batch = arm.pipeline.run(rollout, scores)
    finally:
        arm.close()
    assert all(t is None for t in scores.totals)
    assert batch.metrics["reward/unscored_samples"] == len(rollout)
    assert torch.count_nonzero(batch.advantages) == 0


def _no_answer_data(tmp_path):
    import json

    folder = tmp_path / "noanswer"
    folder.mkdir()
    rows = [{"prompt": f"Q: say {i}? A:"} for i in range(8)]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder
