"""The sampler/learner mismatch on every training step of every mode: each step either logs it
(``rollout/logprob_gap``, ``rollout_corr/*``) on the rows its weights sampled, or says why it
cannot (``rollout_corr/rows_*`` each step, the ``mismatch_unmeasured`` health warning once).

The learner compared each row's policy version with the step index, which the synchronous loop's
engine count (one per sync) left behind for good after a resume (one sync at restore) or a step
dynamic sampling left without an update: no gap from then on."""

from __future__ import annotations

import pytest
import torch

from polyrl.config.schema import resolve_arms
from polyrl.rollout.batches import Rollout, Scores
from polyrl.rollout.collector import Collected
from polyrl.trainer.build_arm import build_arm
from polyrl.trainer.loop import PhaseTimer

MISMATCH = ("rollout/logprob_gap", "rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/log_ppl_diff")

pytestmark = pytest.mark.slow  # whole runs on the tiny policy, as test_mismatch_diagnostics' runs


def _arm(tmp_path, raw, **build):
    return build_arm(resolve_arms(raw)["main"], arm="main", arm_dir=tmp_path / "runs" / "main", **build)


def _assert_measured(metrics: dict[str, float]) -> None:
    for key in MISMATCH:
        assert key in metrics, (key, sorted(k for k in metrics if k.startswith("rollout")))
    # The HF engine samples with the learner's weights in fp32: the mismatch is rounding.
    assert metrics["rollout/logprob_gap"] < 1e-3


def test_a_resumed_run_logs_the_mismatch_on_every_step(tmp_path, tiny_experiment):
    """2 steps, then a resume to 4 (--resume --allow-config-change --set train.steps=4): steps 3-4
    logged no gap (the restore's sync made the engine version 1 against step index 2)."""
    raw = tiny_experiment(train={"steps": 2, "learning_rate": 1e-2, "micro_batch_size": 8})
    arm = _arm(tmp_path, raw)
    try:
        first = arm.loop(printer=lambda _: None).run()
    finally:
        arm.close()
    resumed = _arm(tmp_path, {**raw, "train": {**raw["train"], "steps": 4}}, resume=True)
    try:
        assert resumed.start_step == 2 and resumed.learner.weight_version == 2
        later = resumed.loop(printer=lambda _: None).run()[-2:]
    finally:
        resumed.close()
    for metrics in [*first, *later]:
        _assert_measured(metrics)
    assert [m["rollout/policy_version"] for m in later] == [2.0, 3.0]


def test_a_step_without_an_update_leaves_the_check_on(tmp_path, tiny_experiment):
    """A step whose batch dynamic sampling left empty makes no update and no sync; the steps after
    it logged no gap (the step index ran ahead of the engine's version)."""
    raw = tiny_experiment(train={"steps": 3, "learning_rate": 1e-2, "micro_batch_size": 8})
    arm = _arm(tmp_path, raw)
    try:
        loop = arm.loop(printer=lambda _: None)
        loop.start_hooks()
        first = loop.step()
        # Step 2 as dynamic sampling leaves it when no group is informative: no sample kept.
        empty = Collected(
            Rollout([], [], torch.zeros(0, dtype=torch.long)), Scores([], {"rollout/dynamic_sampling_kept_groups": 0.0})
        )
        skipped = loop.train_on(2, empty, PhaseTimer(), loop.sampler.state_dict())
        third = loop.step()
    finally:
        arm.close()
    assert "actor/loss" not in skipped and arm.learner.weight_version == 2
    _assert_measured(first)
    _assert_measured(third)


def test_an_asynchronous_run_logs_the_mismatch_or_says_why_on_every_step(tmp_path, tiny_experiment):
    """max_staleness 1: a step whose rows all come from the previous weights cannot be compared
    with the weights that sampled them; it says so (rows_older_weights, one health warning)."""
    raw = tiny_experiment(rollout={"max_staleness": 1}, train={"steps": 3, "learning_rate": 1e-2, "micro_batch_size": 8})
    arm = _arm(tmp_path, raw)
    said: list[str] = []
    try:
        history = arm.loop(printer=said.append).run()
    finally:
        arm.close()
    _assert_measured(history[0])  # step 1 trains on version-0 samples, the learner's
    unmeasured = [m for m in history if "rollout/logprob_gap" not in m]
    for metrics in history:
        if "rollout/logprob_gap" in metrics:
            _assert_measured(metrics)
            assert metrics["rollout_corr/rows_measured"] > 0
        else:
            assert metrics["rollout_corr/rows_measured"] == 0 and metrics["rollout_corr/rows_older_weights"] == 16
    if unmeasured:
        assert sum("mismatch_unmeasured" in line for line in said) == 1, said
        assert history[-1]["health/mismatch_unmeasured_trips"] == len(unmeasured)


def test_an_episode_run_logs_the_mismatch_after_a_resume(tmp_path, tiny_arch_dir, monkeypatch):
    from tests.envs.shaped_guess import episode_experiment

    monkeypatch.chdir(tmp_path)
    raw = episode_experiment(tmp_path, tiny_arch_dir("qwen2"), "hf", steps=2, checkpoint={"every": 2})
    arm = _arm(tmp_path, raw)
    try:
        first = arm.loop(printer=lambda _: None).run()
    finally:
        arm.close()
    resumed = _arm(tmp_path, {**raw, "train": {**raw["train"], "steps": 3}}, resume=True)
    try:
        later = resumed.loop(printer=lambda _: None).run()[-1:]
    finally:
        resumed.close()
    for metrics in [*first, *later]:
        _assert_measured(metrics)
