"""polyrl calibrate on a store of real MLflow runs: one arm's seed runs split into A/A pairs."""

from __future__ import annotations

from typer.testing import CliRunner

from polyrl.cli.main import app
from polyrl.tracking.mlflow_runs import ExperimentTracker

METRIC = "eval/arithmetic_chat/accuracy"


def _experiment(uri: str, name: str, values: list[float]) -> None:
    tracker = ExperimentTracker(uri, name)
    parent = tracker.start_parent(name)
    arm_run = tracker.start_arm(parent.run_id, "grpo")
    for seed, value in enumerate(values):
        run = tracker.start_arm(arm_run.run_id, "grpo", seed=seed)
        run.log_params({"train.steps": 2})
        for step in (1, 2):
            run.log_step(step, {"perf/step_s": 1.0})
        run.log_metrics(2, {METRIC: value})
        run.finish()
    arm_run.finish()
    parent.finish()


def test_calibrate_splits_the_arms_seed_runs(mlflow_uri):
    # Six seeds, two a side: C(6,4) = 15 sets of four × 3 halvings = 45 splits; 6 // 4 = 1 disjoint.
    _experiment(mlflow_uri, "aa", [0.50, 0.52, 0.47, 0.55, 0.49, 0.51])
    out = CliRunner().invoke(
        app, ["calibrate", "aa", "--arm", "grpo", "--per-side", "2", "--metric", METRIC, "--tracking-uri", mlflow_uri]
    )
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert f"{METRIC}: A/A at 2 seeds a side (6 seed runs, 45 splits, 1 disjoint)" in text
    assert "nominal 5%" in text


def test_calibrate_refuses_too_few_seeds_and_unknown_names(mlflow_uri):
    _experiment(mlflow_uri, "few", [0.5, 0.6, 0.55])
    base = ["calibrate", "few", "--tracking-uri", mlflow_uri]
    out = CliRunner().invoke(app, [*base, "--arm", "grpo", "--per-side", "2", "--metric", METRIC])
    assert out.exit_code != 0 and "3 finished seed runs cannot make two sides of 2 (needs 4)" in " ".join(out.output.split())
    out = CliRunner().invoke(app, [*base, "--arm", "dapo", "--metric", METRIC])
    assert out.exit_code != 0 and "--arm 'dapo' is not an arm of experiment 'few'; its arms: grpo" in " ".join(out.output.split())
    out = CliRunner().invoke(app, [*base, "--arm", "grpo", "--metric", "eval/nope"])
    assert out.exit_code != 0 and "--metric eval/nope: not logged by the seed runs of 'grpo'" in " ".join(out.output.split())
