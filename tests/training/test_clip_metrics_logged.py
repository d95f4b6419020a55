"""The metrics the clip re-tests read (docs/reproductions.md: DAPO's clip-higher, BAPO) reach
MLflow at every step: the shares of tokens clipped at the lower and at the upper bound, the
policy entropy, the positive-contribution share at the objective's bounds, and BAPO's adaptive
bounds with the share its search steers, synchronously and with rollout.max_staleness 1 (the
off-policy setting BAPO was made for)."""

from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

from polyrl.config.schema import resolve_arms
from polyrl.tracking.mlflow_runs import ExperimentTracker
from polyrl.trainer.build_arm import build_arm

STEPS = 2
CLIP_METRICS = ("actor/clip_frac_low", "actor/clip_frac_high", "actor/entropy", "actor/positive_share")
BAPO_METRICS = ("bapo/c_low", "bapo/c_high", "bapo/positive_share")


def _logged_run(tmp_path, config):
    tracker = ExperimentTracker(config["tracking"]["uri"], "clip_metrics")
    parent = tracker.start_parent("clip_metrics")
    logger = tracker.start_arm(parent.run_id, "main")
    arm = build_arm(resolve_arms(config)["main"], arm="main", arm_dir=tmp_path / "runs" / "main", logger=logger)
    try:
        arm.loop().run()
    finally:
        arm.close()
    client = MlflowClient(config["tracking"]["uri"])
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(logger.run_id, key))
        for key in (*CLIP_METRICS, *BAPO_METRICS)
    }


@pytest.mark.slow
@pytest.mark.parametrize("max_staleness", [0, 1])
def test_bapo_logs_clip_shares_entropy_positive_share_and_bounds_every_step(tmp_path, tiny_experiment, max_staleness):
    # Two updates x two mini-batches per rollout, so the ratio leaves 1 and the bounds matter.
    config = tiny_experiment(
        objective={"name": "bapo"},
        rollout={"max_staleness": max_staleness},
        train={"steps": STEPS, "learning_rate": 1e-2, "micro_batch_size": 8, "updates_per_batch": 2, "mini_batches": 2},
    )
    history = _logged_run(tmp_path, config)
    for key in (*CLIP_METRICS, *BAPO_METRICS):
        assert [step for step, _ in history[key]] == list(range(1, STEPS + 1)), (key, history[key])
        assert all(math.isfinite(value) for _, value in history[key]), (key, history[key])
    for key in ("actor/clip_frac_low", "actor/clip_frac_high", "actor/positive_share", "bapo/positive_share"):
        assert all(0.0 <= value <= 1.0 for _, value in history[key]), (key, history[key])
    # BAPO's search moves the bounds within [c_low_start, c_low_max] and [c_high_start, c_high_max].
    assert all(0.6 - 1e-9 <= value <= 0.9 + 1e-9 for _, value in history["bapo/c_low"])
    assert all(1.2 - 1e-9 <= value <= 3.0 + 1e-9 for _, value in history["bapo/c_high"])
    assert all(value > 0 for _, value in history["actor/entropy"])
