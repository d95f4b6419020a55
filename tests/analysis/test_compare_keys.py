"""Which metrics a comparison report shows and compares, read from a real MLflow store."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from polyrl.analysis.report_metrics import eval_metric_keys, is_eval_score
from polyrl.analysis.single_seed_report import single_seed_report as _single_seed_report


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
    keys = eval_metric_keys(client, [run_id])
    assert keys == [
        "eval/drawing/accuracy",
        "eval/drawing/length/mean",
        "eval/drawing/reward/cells/mean",
        "eval/drawing/reward/mean",
    ]
    assert [k for k in keys if is_eval_score(k)] == [
        "eval/drawing/accuracy",
        "eval/drawing/reward/cells/mean",
        "eval/drawing/reward/mean",
    ]


def test_bapo_bounds_get_columns_only_when_an_arm_logged_them(mlflow_uri, tmp_path):
    client = MlflowClient(mlflow_uri)
    experiment_id = client.create_experiment("bapo_vs_grpo")
    arms = {}
    for arm, extra in (("bapo", {"bapo/c_low": 0.62, "bapo/c_high": 1.31, "bapo/positive_share": 0.41}), ("grpo", {})):
        arms[arm] = run_id = client.create_run(experiment_id).info.run_id
        for step in (1, 2):
            client.log_metric(run_id, "reward/mean", 0.1 * step, step=step)
            for key, value in extra.items():
                client.log_metric(run_id, key, value + step, step=step)
    _report, table, _plots, _histories = _single_seed_report(client, "bapo_vs_grpo", "parent", mlflow_uri, arms, tmp_path)
    header, _rule, *rows = table.splitlines()
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "arm",
        "reward/mean",
        "bapo/c_low",
        "bapo/c_high",
        "bapo/positive_share",
    ]
    cells = {row.strip("|").split("|")[0].strip(): [c.strip() for c in row.strip("|").split("|")[1:]] for row in rows}
    assert cells["bapo"][1:] == ["2.62", "3.31", "2.41"]  # the last step's values (logged value + step 2)
    assert cells["grpo"][1:] == ["–"] * 3  # no BAPO metrics: an empty cell, not a zero
