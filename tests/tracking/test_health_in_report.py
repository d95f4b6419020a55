"""The comparison report lists the health warnings each arm's runs recorded (MLflow tags)."""

from __future__ import annotations

from polyrl.analysis.compare import compare_experiment
from polyrl.tracking.mlflow_runs import ExperimentTracker


def test_report_names_each_arms_health_warnings(tmp_path, mlflow_uri):
    tracker = ExperimentTracker(mlflow_uri, "hacked")
    parent = tracker.start_parent("hacked")
    for arm in ("grpo", "dr_grpo"):
        run = tracker.start_arm(parent.run_id, arm)
        for step in (1, 2):
            run.log_step(step, {"reward/mean": 0.1 * step})
        if arm == "grpo":
            run.set_tags({"health.reward_length": "step 2: reward and completion length correlate at 0.93"})
        run.finish()
    parent.finish()
    comparison = compare_experiment("hacked", tracking_uri=mlflow_uri, out_dir=tmp_path / "r", log_to_mlflow=False)
    report = (comparison.out_dir / "report.md").read_text()
    section = report.split("## Health warnings", 1)[1]
    assert "**grpo** `reward_length`: step 2: reward and completion length correlate at 0.93" in section
    assert "dr_grpo" not in section


def test_report_says_when_no_check_fired(tmp_path, mlflow_uri):
    tracker = ExperimentTracker(mlflow_uri, "calm")
    parent = tracker.start_parent("calm")
    run = tracker.start_arm(parent.run_id, "grpo")
    run.log_step(1, {"reward/mean": 0.5})
    run.finish()
    parent.finish()
    comparison = compare_experiment("calm", tracking_uri=mlflow_uri, out_dir=tmp_path / "r", log_to_mlflow=False)
    report = (comparison.out_dir / "report.md").read_text()
    assert "## Health warnings\n\nNone: no health check fired in any arm." in report
