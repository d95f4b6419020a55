"""The learner's entropy controls: the adaptive coefficient (stepped after each update, logged,
checkpointed) and the high-entropy token selection (the gradient of the top-ρ tokens only)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from polyrl.algos.entropy_control import AdaptiveEntropySettings
from polyrl.algos.objectives import get_objective
from polyrl.config.schema import resolve_arms
from polyrl.core.types import Completion
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.modeling.logprobs import pack_completions, token_logprobs
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm
from polyrl.rollout.batches import LearnerBatch


def _policy():
    return build_tiny_causal_lm(build_char_tokenizer(), "0.3m", seed=0)


def _learner(policy, **settings) -> PolicyLearner:
    objective = get_objective("grpo")
    defaults = dict(
        aggregation="seq_sum_constant_norm",
        objective_params=dict(objective.default_params),
        learning_rate=1e-2,
        micro_batch_size=8,
        max_tokens=3,
    )
    return PolicyLearner(policy, objective, LearnerSettings(**{**defaults, **settings}))


def _batch() -> LearnerBatch:
    rows = [([5, 6], [7, 8, 9]), ([5, 6], [10, 11]), ([12], [7]), ([12], [8, 9, 10])]
    completions = [
        Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-3.0] * len(c), finish_reason="stop")
        for p, c in rows
    ]
    packed = pack_completions(completions, pad_token_id=0)
    return LearnerBatch(
        packed=packed, old_logprobs=None, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * packed.response_mask
    )


def test_the_entropy_coefficient_adapts_after_each_update_and_is_checkpointed():
    settings = AdaptiveEntropySettings(target=10.0, step_size=0.01, max_coef=1.0)
    learner = _learner(_policy(), entropy_control=settings)
    metrics = learner.update(_batch())
    # start 0; the target (10 nats) is above the tiny policy's entropy: 0 + 0.01 × (10 − H)
    expected = 0.01 * (10.0 - metrics["actor/entropy"])
    assert metrics["actor/entropy_coef"] == pytest.approx(expected) and learner.entropy.coef == pytest.approx(expected)
    second = learner.update(_batch(), step_index=1)  # the bonus is on now, and the coefficient moves again
    assert second["actor/entropy_coef"] == pytest.approx(expected + 0.01 * (10.0 - second["actor/entropy"]))
    restored = _learner(_policy(), entropy_control=settings)
    restored.load_state_dict(learner.state_dict())
    assert restored.entropy.coef == learner.entropy.coef
    # without the control the coefficient is train.entropy_coef, unchanged and not logged
    fixed = _learner(_policy(), entropy_coef=0.01)
    assert "actor/entropy_coef" not in fixed.update(_batch()) and fixed.entropy.coef == 0.01


def test_only_the_high_entropy_tokens_train():
    policy, by_hand_policy = _policy(), _policy()
    batch = _batch()
    metrics = _learner(policy, high_entropy_top_ratio=0.5).update(batch)
    # 9 response tokens: ceil(4.5) = 5 keep their gradient (one micro-batch holds the whole batch)
    assert metrics["actor/high_entropy_kept_fraction"] == pytest.approx(5 / 9)
    # The same update with the 5 highest-entropy tokens chosen by hand as the loss mask.
    with torch.no_grad():
        _, entropy = token_logprobs(by_hand_policy, batch.packed, compute_entropy=True)
    mask = batch.packed.response_mask.bool()
    threshold = entropy[mask].topk(5).values.min()
    by_hand = dataclasses.replace(batch, loss_mask=mask & (entropy >= threshold))
    _learner(by_hand_policy).update(by_hand)
    for (name, p), q in zip(policy.named_parameters(), by_hand_policy.parameters()):
        torch.testing.assert_close(p, q, msg=name)


def test_with_high_entropy_tokens_the_controller_steers_on_every_trained_tokens_entropy():
    """actor/entropy was the mean over the selected (top) tokens only, well above the policy's, so
    the adaptive coefficient saw the target reached and never turned its bonus on."""
    policy = _policy()
    batch = _batch()
    with torch.no_grad():
        _, entropy = token_logprobs(policy, batch.packed, compute_entropy=True)
    mask = batch.packed.response_mask.bool()
    every, top = float(entropy[mask].mean()), float(entropy[mask].topk(5).values.mean())  # 5 of 9 kept
    assert top > every
    settings = AdaptiveEntropySettings(target=(every + top) / 2, step_size=0.1, max_coef=1.0)  # between the two
    metrics = _learner(policy, high_entropy_top_ratio=0.5, entropy_control=settings).update(batch)
    assert metrics["actor/entropy"] == pytest.approx(every, rel=1e-5)
    assert metrics["actor/entropy_selected"] == pytest.approx(top, rel=1e-5)
    # Below the target: the bonus turns on, 0.1 × (target − H) = 0.05 × (top − every).
    assert metrics["actor/entropy_coef"] == pytest.approx(0.05 * (top - every), abs=1e-7) and metrics["actor/entropy_coef"] > 0
    # Micro-batches of 2 rows (each selects its own top half): the trained tokens' mean is the same.
    cut = _learner(_policy(), high_entropy_top_ratio=0.5, micro_batch_size=2).update(batch)
    assert cut["actor/entropy"] == pytest.approx(every, rel=1e-5)


def test_the_config_reaches_the_learner_settings():
    from polyrl.trainer.build_models import learner_settings

    cfg = resolve_arms(
        {"name": "t", "objective": {"adaptive_entropy": {"target": 1.0, "step_size": 0.05}, "high_entropy_tokens": {}}}
    )["main"]
    settings = learner_settings(cfg, get_objective(cfg.objective.name))
    assert settings.entropy_control == AdaptiveEntropySettings(target=1.0, step_size=0.05, max_coef=0.1)
    assert settings.high_entropy_top_ratio == 0.2


@pytest.mark.slow
def test_a_resumed_run_continues_from_the_adapted_coefficient(tmp_path, tiny_experiment):
    from polyrl.trainer.build_arm import build_arm

    raw = tiny_experiment(
        objective={"adaptive_entropy": {"target": 10.0, "step_size": 0.01}},
        train={"steps": 2, "learning_rate": 1e-2, "micro_batch_size": 8},
        checkpoint={"dir": str(tmp_path / "runs"), "every": 2},
    )
    cfg = resolve_arms(raw)["main"]
    arm = build_arm(cfg, arm="main", arm_dir=tmp_path / "runs" / "main")
    try:
        history = arm.loop().run()
        coef = arm.learner.entropy.coef
    finally:
        arm.close()
    assert coef > 0 and history[-1]["actor/entropy_coef"] == pytest.approx(coef)
    resumed = build_arm(cfg, arm="main", arm_dir=tmp_path / "runs" / "main", resume=True)
    try:
        assert resumed.start_step == 2 and resumed.learner.entropy.coef == pytest.approx(coef)
    finally:
        resumed.close()
