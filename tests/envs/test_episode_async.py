"""``env:`` with ``rollout.max_staleness: 1``: asynchronous training plays episodes ahead of the
learner; an episode carries the weights version of its first turn (its oldest), the staleness
metric reads it, and observation tokens stay out of the loss."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from polyrl.config.schema import ExperimentConfig
from polyrl.roles.arm import build_arm
from tests.envs.shaped_guess import episode_experiment, observation_grad_is_zero


class SignalsFirstTurn:
    """The producer's engine for one step: ``turned`` is set once that step's first turn is sampled."""

    def __init__(self, engine, turned: threading.Event):
        self.engine, self.turned = engine, turned

    def generate(self, prompts, settings):
        out = self.engine.generate(prompts, settings)
        self.turned.set()
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.mark.slow
def test_staleness_one_trains_on_episodes_sampled_a_version_behind(tmp_path, tiny_arch_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = episode_experiment(tmp_path, tiny_arch_dir("qwen2"), "hf", steps=3, rollout={"max_staleness": 1})
    arm = build_arm(ExperimentConfig.model_validate(config), arm="main", arm_dir=tmp_path / "runs" / "main")
    played, turned = [], threading.Event()
    try:
        runner = arm.collector.episodes
        run = runner.run

        def recorded(engine, prompts, sampling):
            # Step 2's episodes (the producer's second call) tell when their first turn is sampled.
            groups = run(SignalsFirstTurn(engine, turned) if len(played) == 1 else engine, prompts, sampling)
            played.append([c for group in groups for c in group])
            return groups

        runner.run = recorded
        loop = arm.loop(printer=lambda _: None)
        sync = loop.sync

        def held_sync():
            # Update 1's sync waits until step 2's first turn was sampled (at version 0), so step 2
            # trains one version behind whatever the timing of this machine.
            if loop.step_index == 0:
                assert turned.wait(timeout=120), "step 2 never played an episode turn"
            sync()

        loop.sync = held_sync
        before = {n: p.detach().clone() for n, p in arm.learner.policy.named_parameters()}
        history = loop.run()
    finally:
        arm.close()
    policy = arm.learner.policy
    assert len(history) == 3 and all(math.isfinite(h["actor/loss"]) for h in history)
    assert any(not torch.equal(before[n], p) for n, p in policy.named_parameters())
    # Step 1 is always sampled by version 0 (staleness 0); step 2's episodes started at version 0
    # and train at version 1: every one of its 8 samples is 1 version old.
    assert history[0]["async/staleness_max"] == 0.0
    assert history[1]["async/staleness/1"] == 8.0 and history[1]["async/staleness_max"] == 1.0
    assert all(h["async/staleness_max"] <= 1 for h in history)
    assert [c.policy_version for c in played[1]] == [0] * 8
    assert all(c.episode["policy_versions"][0] == 0 for c in played[1])
    assert 0.0 <= history[1]["episode/mixed_versions_share"] <= 1.0
    for h in history:
        assert h["episode/observation_tokens_mean"] > 0
        # Lengths count the policy's tokens only: the observation tokens are not the policy's.
        assert h["rollout/response_length/mean"] == pytest.approx(h["episode/policy_tokens_mean"])
    # π_old is the sampler's log-probs (max_staleness > 0): 0 on observation tokens, which the
    # response mask leaves out of the ratio, the loss and its gradient.
    for c in played[1]:
        assert all(lp == 0.0 for lp, m in zip(c.sampling_logprobs, c.completion_mask) if not m)
    assert observation_grad_is_zero(policy, played[1])
