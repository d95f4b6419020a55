"""Cumulative compute per step (compute/*): what each step adds, and a resume continues the count."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from polyrl.launch.runner import run_experiment
from polyrl.trainer.compute_counters import ComputeCounters
from polyrl.trainer.hooks import StepReport


def test_each_step_adds_its_work_by_hand():
    counters = ComputeCounters(parameters=1000, passes_per_batch=2, checkpointer=None, start={"generated_tokens": 5.0})
    metrics = {"rollout/samples": 8.0, "rollout/response_length/mean": 12.5, "train/tokens": 300.0, "perf/step_s": 1.5}
    counters.publish(StepReport(1, metrics, []))
    # generated: 5 (carried over) + 8 × 12.5 = 105; learner tokens: 300 × 2 passes = 600;
    # FLOPs: 6 × 1000 parameters × 600 tokens = 3.6e6; seconds: 1.5.
    assert metrics["compute/generated_tokens"] == 105.0
    assert metrics["compute/learner_tokens"] == 600.0
    assert metrics["compute/learner_flops"] == 3.6e6
    assert metrics["compute/seconds"] == 1.5
    step2 = {"rollout/samples": 4.0, "rollout/response_length/mean": 10.0, "train/tokens": 100.0, "perf/step_s": 0.5}
    counters.publish(StepReport(2, step2, []))
    assert step2["compute/generated_tokens"] == 145.0 and step2["compute/seconds"] == 2.0


@pytest.mark.slow
def test_a_run_logs_cumulative_compute_and_a_resume_continues_it(tmp_path, tiny_experiment, write_experiment, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tiny_experiment(name="compute", train={"steps": 2}, checkpoint={"every": 1})
    path = write_experiment(tmp_path, config)
    first = run_experiment(path, show_progress=False)
    run_id = first.arm_run_ids["main"]
    client = MlflowClient(config["tracking"]["uri"])

    def history(key):
        return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]

    generated = history("compute/generated_tokens")
    samples, lengths = history("rollout/samples"), history("rollout/response_length/mean")
    assert generated == pytest.approx([samples[0] * lengths[0], samples[0] * lengths[0] + samples[1] * lengths[1]])
    flops, tokens = history("compute/learner_flops"), history("compute/learner_tokens")
    assert flops[1] / tokens[1] == pytest.approx(flops[0] / tokens[0]) and flops[0] / tokens[0] > 6 * 1e5  # 6 N, N ≈ 0.3M
    # Two more steps on --resume: the counters go on from step 2's totals.
    run_experiment(path, resume=True, allow_config_change=True, set_options=["train.steps=4"], show_progress=False)
    after = history("compute/generated_tokens")
    assert len(after) == 4 and after[:2] == pytest.approx(generated)
    assert after[2] > after[1] and after[3] > after[2]
    seconds = history("compute/seconds")
    assert all(b > a for a, b in zip(seconds, seconds[1:]))
