"""``env:`` with ``rollout.max_staleness: 1``: asynchronous training plays episodes ahead of the
learner; an episode carries the weights version of its first turn (its oldest), the staleness
metric reads it, and observation tokens stay out of the loss."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from polyrl.config.schema import ExperimentConfig
from polyrl.trainer.build_arm import build_arm
from tests.envs.shaped_guess import episode_experiment, observation_grad_is_zero


class TurnGate:
    """The producer's engine for one step: ``turned`` is set once the step's first turn is
    sampled; its later turns wait for ``synced`` (the learner's next sync)."""

    def __init__(self, engine, turned: threading.Event, synced: threading.Event):
        self.engine, self.turned, self.synced = engine, turned, synced
        self.calls = 0

    def generate(self, prompts, settings):
        self.calls += 1
        if self.calls > 1:
            assert self.synced.wait(timeout=120), "the learner never synced"
        out = self.engine.generate(prompts, settings)
        self.turned.set()
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _turn_gaps(policy, weights, completions) -> tuple[float, float]:
    """Mean |sampler - ``weights``| log-prob over the episodes' first-turn policy tokens and over
    their later turns' policy tokens."""
    import copy

    from polyrl.modeling.logprobs import pack_completions, token_logprobs

    model = copy.deepcopy(policy).eval()
    model.load_state_dict(weights)
    packed = pack_completions(completions, pad_token_id=0)
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, packed)
    gap = (logprobs - packed.sampling_logprobs).abs()
    mask = packed.response_mask.bool()
    first = torch.zeros_like(mask)
    for row, c in enumerate(completions):
        first[row, : c.completion_mask.index(0)] = True  # the tokens before the first observation
    return float(gap[mask & first].mean()), float(gap[mask & ~first].mean())


@pytest.mark.slow
def test_staleness_one_trains_on_episodes_sampled_a_version_behind(tmp_path, tiny_arch_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = episode_experiment(tmp_path, tiny_arch_dir("qwen2"), "hf", steps=3, rollout={"max_staleness": 1})
    arm = build_arm(ExperimentConfig.model_validate(config), arm="main", arm_dir=tmp_path / "runs" / "main")
    played, turned, synced, version_1 = [], threading.Event(), threading.Event(), {}
    try:
        runner = arm.collector.episodes
        run = runner.run

        def recorded(engine, prompts, sampling):
            # Step 2's episodes (the producer's second call): turn 1 at version 0, the later turns
            # after update 1's sync, at version 1.
            groups = run(TurnGate(engine, turned, synced) if len(played) == 1 else engine, prompts, sampling)
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
            if loop.step_index == 0:
                version_1.update({n: p.detach().clone() for n, p in arm.learner.policy.state_dict().items()})
                synced.set()

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
    # Episodes that went on after turn 1 span versions 0 and 1 (and carry 0, their oldest).
    later = [c for c in played[1] if 0 in c.completion_mask and 1 in c.completion_mask[c.completion_mask.index(0) :]]
    assert later, "no episode of step 2 had a second turn"
    assert all(c.episode["policy_versions"] == [0, 1] for c in later)
    assert history[1]["episode/mixed_versions_share"] == pytest.approx(
        sum(c.episode["assistant_turns"] > 1 for c in played[1]) / 8
    )
    # Each policy token keeps the log-prob of the weights that sampled it: version 1's weights
    # score the later turns' tokens as the sampler did, not turn 1's (sampled by version 0).
    first_turn, later_turns = _turn_gaps(arm.learner.policy, version_1, later)
    assert later_turns < 1e-4 and first_turn > 1e-3, (first_turn, later_turns)
    for h in history:
        assert h["episode/observation_tokens_mean"] > 0
        # Lengths count the policy's tokens only: the observation tokens are not the policy's.
        assert h["rollout/response_length/mean"] == pytest.approx(h["episode/policy_tokens_mean"])
    # π_old is the sampler's log-probs (max_staleness > 0): 0 on observation tokens, which the
    # response mask leaves out of the ratio, the loss and its gradient.
    for c in played[1]:
        assert all(lp == 0.0 for lp, m in zip(c.sampling_logprobs, c.completion_mask) if not m)
    assert observation_grad_is_zero(policy, played[1])
