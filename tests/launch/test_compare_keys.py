"""Which eval metrics a comparison report shows and compares, read from a real MLflow store."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from polyrl.launch.compare import _eval_keys, is_eval_score


def test_named_eval_rewards_are_headline_metrics_and_lengths_are_not_compared(mlflow_uri):
    client = MlflowClient(mlflow_uri)
    run_id = client.create_run(client.create_experiment("keys")).info.run_id
    logged = {
        "eval/drawing/reward/mean": 1.29,  # the weighted total of two rewards
        "eval/drawing/reward/cells/mean": 0.66,  # the drawing task's headline: one named reward
        "eval/drawing/reward/cells/std": 0.2,  # spread: stays in MLflow only
        "eval/drawing/length/mean": 12.1,
        "eval/drawing/accuracy": 0.4,
        "eval/drawing/samples": 48,
        "train/reward/mean": 0.5,
    }
    for key, value in logged.items():
        client.log_metric(run_id, key, value, step=10)
    keys = _eval_keys(client, [run_id])
    assert keys == ["eval/drawing/accuracy", "eval/drawing/length/mean", "eval/drawing/reward/cells/mean", "eval/drawing/reward/mean"]
    assert [k for k in keys if is_eval_score(k)] == ["eval/drawing/accuracy", "eval/drawing/reward/cells/mean", "eval/drawing/reward/mean"]
