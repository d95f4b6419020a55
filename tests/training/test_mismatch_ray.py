"""The sampler/learner mismatch on every step of a resumed run with Ray actors: data-parallel
learner ranks (train.learner_workers) and rollout workers (rollout.workers). The ranks count the
weight versions the mirror's syncs send; the workers stamp the version each sync gives them.
Before, the check went dark after the resume (the restore's sync: version 1 against step 2)."""

from __future__ import annotations

import pytest

from polyrl.config.schema import resolve_arms
from polyrl.learner.ranks import DataParallelLearner
from polyrl.trainer.build_arm import build_arm

pytestmark = [pytest.mark.slow, pytest.mark.ray]  # a local Ray cluster and whole (tiny) runs


def _two_steps_then_one_more(tmp_path, raw) -> tuple[list[dict[str, float]], type, type]:
    """2 steps, then a resume to 3 (as --resume --allow-config-change --set train.steps=3)."""
    arm = build_arm(resolve_arms(raw)["main"], arm="main", arm_dir=tmp_path / "runs" / "main")
    try:
        learner, engine = type(arm.learner), type(arm.collector.engine)
        history = arm.loop(printer=lambda _: None).run()
    finally:
        arm.close()
    longer = resolve_arms({**raw, "train": {**raw["train"], "steps": 3}})["main"]
    resumed = build_arm(longer, arm="main", arm_dir=tmp_path / "runs" / "main", resume=True)
    try:
        assert resumed.start_step == 2
        history += resumed.loop(printer=lambda _: None).run()[-1:]
    finally:
        resumed.close()
    return history, learner, engine


def _assert_every_step_measured(history: list[dict[str, float]]) -> None:
    assert len(history) == 3
    for metrics in history:
        assert "rollout/logprob_gap" in metrics and "rollout_corr/k3_kl" in metrics, sorted(metrics)
        assert metrics["rollout/logprob_gap"] < 1e-3  # fp32 sampler with the learner's weights


def test_data_parallel_learner_ranks_measure_the_mismatch_after_a_resume(ray_local, tmp_path, tiny_experiment):
    raw = tiny_experiment(train={"steps": 2, "learning_rate": 1e-2, "micro_batch_size": 4, "learner_workers": 2})
    history, learner, _ = _two_steps_then_one_more(tmp_path, raw)
    assert learner is DataParallelLearner
    _assert_every_step_measured(history)


def test_rollout_workers_measure_the_mismatch_after_a_resume(ray_local, tmp_path, tiny_experiment):
    raw = tiny_experiment(rollout={"workers": 2}, train={"steps": 2, "learning_rate": 1e-2, "micro_batch_size": 8})
    history, _, engine = _two_steps_then_one_more(tmp_path, raw)
    assert engine.__name__ == "RolloutWorkerPool"
    _assert_every_step_measured(history)
