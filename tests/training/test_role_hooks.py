"""The hooks alone, on plain step reports: a real MLflow SQLite store for the logging ones, a
tiny torch module for the checkpointer. The evaluator is a plain function (the hook's logic
around it is under test; the real evaluator is tested in tests/evals/test_eval_periodic.py)."""

from __future__ import annotations

import json

import torch
from mlflow.tracking import MlflowClient

from polyrl.config.schema import HealthConfig
from polyrl.evals.periodic import PeriodicResult
from polyrl.monitoring.health import HealthMonitor
from polyrl.tracking.mlflow_runs import ExperimentTracker
from polyrl.trainer.checkpoint import checkpoint_dirs
from polyrl.trainer.hooks import Callback, Checkpointer, HealthHook, MetricLogger, PeriodicEvalHook, SampleTableHook, StepReport


def _logger(uri):
    tracker = ExperimentTracker(uri, "hooks")
    return tracker.start_arm(tracker.start_parent("hooks").run_id, "main")


def test_checkpointer_saves_on_its_cadence_and_after_the_last_step_and_restores(tmp_path):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    counter = {"n": 0}
    checkpointer = Checkpointer(
        tmp_path / "arm",
        every=2,
        keep=2,
        last_step=5,
        models={"policy": model},
        optimizers={"policy": optimizer},
        state=lambda: {"position": counter["n"]},
        extra={"run": "r1"},
    )
    for step in range(1, 6):
        counter["n"] = step * 10
        checkpointer.publish(StepReport(step, {}))
    # saved after steps 2, 4 and 5 (the last); the newest 2 are kept
    assert [p.name for p in checkpoint_dirs(tmp_path / "arm")] == ["step_000004", "step_000005"]
    saved = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    state = checkpointer.restore_latest()
    assert torch.equal(model.weight, saved)
    assert (state["step"], state["position"], state["run"]) == (5, 50, "r1")
    info = json.loads((tmp_path / "arm" / "step_000005" / "checkpoint.json").read_text())
    assert info["position"] == 50


def test_health_hook_prints_counts_and_tags_warnings(mlflow_uri):
    printed: list[str] = []
    logger = _logger(mlflow_uri)
    hook = HealthHook(HealthMonitor(HealthConfig()), arm="a", printer=printed.append, logger=logger)
    report = StepReport(3, {"health/nonfinite_loss_steps": 1.0})
    hook.observe(report)
    assert report.metrics["health/warnings"] == 1.0
    assert len(printed) == 1 and printed[0].startswith("[a] health warning at step 3: nonfinite_loss:")
    assert MlflowClient(mlflow_uri).get_run(logger.run_id).data.tags["health.nonfinite_loss"].startswith("step 3:")


def test_eval_and_sample_tables_log_once_per_step_and_not_again_for_a_replayed_step(mlflow_uri):
    logger = _logger(mlflow_uri)
    calls: list[int] = []

    def evaluator(engine, step):
        calls.append(step)
        return PeriodicResult({"p/accuracy": 0.5}, [{"prompt": "q", "completion": "a"}])

    hooks = [
        SampleTableHook(logger, every=5, rows=1),
        PeriodicEvalHook(evaluator, "engine", every=2, logger=logger),
        MetricLogger(logger),
    ]
    seen: list[int] = []
    hooks.append(Callback(lambda step, metrics: seen.append(step)))
    hooks[1].start(0)
    for step in (1, 2):
        report = StepReport(
            step, {"m": float(step)}, samples=[{"prompt": "q", "completion": "x"}, {"prompt": "r", "completion": "y"}]
        )
        for hook in hooks:
            hook.observe(report)
        for hook in hooks:
            hook.publish(report)
    again = StepReport(2, {"m": 2.0}, samples=[{"prompt": "q", "completion": "x"}])
    for hook in hooks:
        hook.observe(again)  # step 2 is logged already: no evaluation, no table
    assert calls == [0, 2] and seen == [1, 2] and "eval/p/accuracy" not in again.metrics
    client = MlflowClient(mlflow_uri)
    assert sorted(m.step for m in client.get_metric_history(logger.run_id, "eval/p/accuracy")) == [0, 2]
    assert {a.path for a in client.list_artifacts(logger.run_id, "samples")} == {"samples/step_00001.json"}
    path = client.download_artifacts(logger.run_id, "eval_samples/step_00002.json", str(mlflow_uri.split("///")[1] + ".dl"))
    assert json.load(open(path))["data"] == [[2, "q", "a"]]
