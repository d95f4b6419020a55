"""Health checks that must be able to act: a step that trained on nothing says so (every sample
unscored; the rollout correction's bands masking every token), the held-out divergence monitor
gets the step-0 evaluation and says at the start when its window cannot hold two evaluations, and
a judge/rule pair naming one reward twice is refused."""

from __future__ import annotations

import json

import pytest
import torch

from polyrl.config.schema import ExperimentConfig, resolve_arms
from polyrl.config.tracking import HealthConfig
from polyrl.core.errors import PolyrlError
from polyrl.core.types import Completion
from polyrl.evals.periodic import PeriodicResult
from polyrl.modeling.logprobs import pack_completions
from polyrl.monitoring.health import HealthMonitor
from polyrl.rollout.batches import Rollout, Scores
from polyrl.trainer.hooks import HealthHook, PeriodicEvalHook, StepReport
from polyrl.trainer.loop import TrainingLoop
from polyrl.trainer.pipeline import PipelineBatch, PipelineContext, rollout_correction


def test_a_judge_rule_pair_of_one_reward_is_refused():
    with pytest.raises(PolyrlError, match=r"health\.judge_rule_pairs: \['judge'\] paired with itself"):
        resolve_arms({"name": "t", "health": {"judge_rule_pairs": {"judge": "judge", "other": "rule"}}})
    assert resolve_arms({"name": "t", "health": {"judge_rule_pairs": {"judge": "rule"}}})


# --- steps that train on nothing -----------------------------------------------------------------


def test_a_step_whose_every_sample_is_unscored_warns_once():
    monitor = HealthMonitor(HealthConfig())
    step = {"rollout/samples": 16.0, "reward/unscored": 16.0, "train/samples": 16.0}
    warnings = monitor.check(1, dict(step))
    assert len(warnings) == 1 and warnings[0].startswith("all_unscored:") and "16 samples" in warnings[0]
    assert monitor.check(2, dict(step)) == [] and monitor.fired["all_unscored"] == 2
    assert HealthMonitor(HealthConfig()).check(1, {**step, "reward/unscored": 15.0}) == []  # one scored sample trains


def test_an_allow_unscored_run_that_scores_nothing_says_so(tmp_path, tiny_experiment):
    from polyrl.trainer.build_arm import build_arm

    data = tmp_path / "no_answer.jsonl"  # `accuracy` returns None for rows without an answer
    data.write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(8)))
    raw = tiny_experiment(
        data={"source": str(data)}, rewards=[{"module": "accuracy", "allow_unscored": True}], train={"steps": 1}
    )
    arm = build_arm(resolve_arms(raw)["main"], arm="main", arm_dir=tmp_path / "runs" / "main")
    said: list[str] = []
    try:
        history = arm.loop(printer=said.append).run()
    finally:
        arm.close()
    assert history[0]["reward/unscored"] == history[0]["rollout/samples"] == 16
    assert [line for line in said if "all_unscored" in line], said


def _corrected(band: tuple[float, float]) -> dict[str, float]:
    """The decoupled correction stage on two rows whose π_old sits 1 nat per token above the sampler."""
    completions = [
        Completion(prompt_ids=[1], completion_ids=[5, 6], text="", sampling_logprobs=[-2.0, -2.0], finish_reason="stop")
        for _ in range(2)
    ]
    packed = pack_completions(completions, pad_token_id=0)
    rollout = Rollout([None, None], completions, torch.zeros(2, dtype=torch.long))
    batch = PipelineBatch(
        rollout, Scores([1.0, 0.0], {}), packed=packed, old_logprobs=torch.full((2, 2), -1.0),
        advantages=torch.ones(2, 2), loss_mask=packed.response_mask.bool(),
    )  # fmt: skip
    cfg = ExperimentConfig(name="t", objective={"rollout_correction": {"geometric": {"low": band[0], "high": band[1]}}})
    ctx = PipelineContext(
        estimator=None, estimator_params={}, pad_token_id=0, rollout_correction=cfg.objective.rollout_correction
    )
    return rollout_correction(batch, ctx).metrics


def test_rejection_bands_that_mask_every_token_warn():
    # Geometric-mean ratio e^1 = 2.72 on both rows: outside [0.5, 2.0] (every token masked), inside [0.5, 3.0].
    masked = {**_corrected((0.5, 2.0)), "train/samples": 2.0}
    assert masked["rollout_corr/masked_token_fraction"] == 1.0
    warnings = HealthMonitor(HealthConfig()).check(1, masked)
    assert len(warnings) == 1 and warnings[0].startswith("correction_masked_everything:")
    kept = {**_corrected((0.5, 3.0)), "train/samples": 2.0}
    assert kept["rollout_corr/masked_token_fraction"] == 0.0 and HealthMonitor(HealthConfig()).check(1, kept) == []


# --- the held-out divergence monitor ---------------------------------------------------------------


def _health(**overrides) -> HealthConfig:
    return ExperimentConfig(name="t", health=overrides).health


def test_a_held_out_window_shorter_than_the_evaluation_cadence_is_said_at_the_start():
    """calculator_grpo.yaml (eval.every 12, reward_window 10) and model_rewards.yaml (12, 6): the
    check needs two evaluations within its window and could never fire."""
    blind = HealthMonitor(_health(reward_window=10), eval_every=12, steps=12)
    assert len(blind.notes) == 1 and blind.notes[0].startswith("held_out_blind: health.reward_window 10 < eval.every 12")
    short = HealthMonitor(_health(reward_window=20), eval_every=12, steps=8)
    assert len(short.notes) == 1 and "train.steps 8 < eval.every 12" in short.notes[0]
    assert HealthMonitor(_health(reward_window=12), eval_every=12, steps=12).notes == []
    assert HealthMonitor(_health(reward_window=2), eval_every=0, steps=12).notes == []  # no periodic evaluation
    said: list[str] = []
    HealthHook(blind, arm="a", printer=said.append).start(0)
    assert said == [f"[a] warning: {blind.notes[0]}"]


def test_the_step_0_evaluation_lets_the_held_out_check_fire_at_the_first_periodic_one():
    """Evaluations at steps 0 and 12, the training reward rising while the held-out score stays
    flat: the check fires at step 12. The monitor never got step 0's, so it had one point."""
    monitor = HealthMonitor(_health(reward_window=12), held_out=True, eval_every=12, steps=12)
    assert monitor.notes == []
    said: list[str] = []
    hooks = [
        HealthHook(monitor, arm="a", printer=said.append),
        PeriodicEvalHook(lambda engine, step: PeriodicResult({"suite/accuracy": 0.5}, []), "engine", every=12),
    ]
    loop = TrainingLoop(arm="a", steps=12, sampler=None, collector=None, pipeline=None, learner=None,
                        engine_dtype=torch.float32, checkpointer=None, hooks=hooks)  # fmt: skip
    loop.start_hooks()  # step 0: the evaluation, then the health hook gets it
    for step in range(1, 13):
        report = StepReport(step, {"reward/mean": step / 12})  # rises by 1 over the window
        for hook in hooks:
            hook.observe(report)
        for hook in hooks:
            hook.publish(report)
    fired = [line for line in said if "held_out_divergence/eval/suite/accuracy" in line]
    assert len(fired) == 1 and fired[0].startswith("[a] health warning at step 12:"), said
