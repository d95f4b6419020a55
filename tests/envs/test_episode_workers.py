"""``env:`` with ``rollout.workers: 2``: each turn of the live episodes is one call on the worker
pool, cut over both workers (ids in, ids out, the sampler's log-probs kept), and the weights reach
both workers after every update: the run plays and trains exactly as the in-process engine."""

from __future__ import annotations

import math

import pytest

from polyrl.config.schema import ExperimentConfig
from polyrl.trainer.build_arm import build_arm
from tests.envs.shaped_guess import episode_experiment, observation_grad_is_zero, train_recording
from tests.ray_support import in_process_cluster

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.ray]


@pytest.fixture(scope="module")
def ray_cluster():
    # Two workers of 1 CPU each and the driver (as tests/workers/conftest.py).
    yield from in_process_cluster(num_cpus=4, object_store_mb=200)


def train(config: dict, arm_dir):
    arm = build_arm(ExperimentConfig.model_validate(config), arm="main", arm_dir=arm_dir)
    played, calls = [], []
    try:
        runner, engine = arm.collector.episodes, arm.collector.engine
        run, generate = runner.run, engine.generate

        def recorded(*args, **kwargs):
            groups = run(*args, **kwargs)
            played.append([c for group in groups for c in group])
            return groups

        def counted(prompts, settings, **kwargs):
            calls.append(len(prompts))
            return generate(prompts, settings, **kwargs)

        runner.run, engine.generate = recorded, counted
        history = arm.loop(printer=lambda _: None).run()
        kind = type(engine).__name__
    finally:
        arm.close()
    return arm, history, played, calls, kind


@pytest.mark.slow
def test_two_workers_play_and_train_episodes_as_one_engine(ray_cluster, tmp_path, tiny_arch_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = episode_experiment(tmp_path, tiny_arch_dir("qwen2"), "hf")
    _, local, local_played, local_calls, local_kind = train(config, tmp_path / "one")
    config["rollout"]["workers"] = 2
    arm, spread, spread_played, spread_calls, spread_kind = train(config, tmp_path / "two")
    assert (local_kind, spread_kind) == ("HFRolloutEngine", "RolloutWorkerPool")
    assert all(math.isfinite(h["actor/loss"]) for h in spread)
    # One pool call per turn, as many as the in-process engine's; turn 1 has all 8 episodes.
    assert spread_calls == local_calls and spread_calls[0] == 8 and len(spread_calls) > 2
    # Per-request seeding by position in the whole batch: the same episodes, token for token,
    # with the same sampling log-probs, masks and returns, at both steps (so step 2 sampled with
    # update 1's weights on both workers).
    for mine, theirs in zip(spread_played, local_played, strict=True):
        assert [c.prompt_ids + c.completion_ids for c in mine] == [c.prompt_ids + c.completion_ids for c in theirs]
        assert [c.completion_mask for c in mine] == [c.completion_mask for c in theirs]
        assert [c.episode["return"] for c in mine] == [c.episode["return"] for c in theirs]
        for a, b in zip(mine, theirs):
            assert a.sampling_logprobs == pytest.approx(b.sampling_logprobs, abs=1e-5)
    assert [h["rollout/policy_version"] for h in spread] == [0.0, 1.0]
    assert spread[-1]["rollout/logprob_gap"] < 1e-4
    for mine, theirs in zip(spread, local):
        for key in ("reward/mean", "episode/turns_mean", "episode/observation_tokens_mean", "actor/loss"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
    assert observation_grad_is_zero(arm.learner.policy, spread_played[1])


@pytest.mark.slow
def test_two_workers_play_episodes_ahead_for_a_lora_policy(ray_cluster, tmp_path, tiny_arch_dir, monkeypatch):
    """All three at once: rollout.workers 2, max_staleness 1 (two buffer partitions, one worker
    each, step t collected by worker (t - 1) mod 2) and a LoRA policy sent as merged weights."""
    import torch

    monkeypatch.chdir(tmp_path)
    config = episode_experiment(
        tmp_path,
        tiny_arch_dir("qwen2"),
        "hf",
        steps=3,
        rollout={"workers": 2, "max_staleness": 1},
        model={"lora": {"r": 4, "alpha": 8, "target_modules": "all-linear"}},
    )
    arm, history, played, base, adapter = train_recording(config, tmp_path / "runs" / "main")
    policy = arm.learner.policy
    assert len(history) == 3 and all(math.isfinite(h["actor/loss"]) for h in history)
    assert [h["async/partition"] for h in history] == [0.0, 1.0, 0.0]
    assert all(h["async/staleness_max"] <= min(1, step) for step, h in enumerate(history))
    assert all(h["episode/observation_tokens_mean"] > 0 for h in history)
    assert len(played) == 3 and all(len(episodes) == 8 for episodes in played)
    assert all(torch.equal(base[n], p) for n, p in policy.named_parameters() if not p.requires_grad)
    assert any(not torch.equal(adapter[n], p) for n, p in policy.named_parameters() if p.requires_grad)
    assert observation_grad_is_zero(policy, played[-1])
