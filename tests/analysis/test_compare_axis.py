"""``polyrl compare --axis tokens|flops|seconds``: arms compared at equal compute, on real MLflow
stores. Arm ``wide`` samples twice the tokens per step of arm ``narrow`` and both improve by the
same amount per token: at equal steps wide looks better, at equal generated tokens they are equal.
The final values are taken at the most every run reached (the smallest final counter), as each
run's last logged point at or before it (no interpolation); runs without the counters are refused.
"""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from polyrl.analysis.compare import compare_experiment
from polyrl.analysis.compare_axis import AXES, AxisError, Budget, axis_named, x_at
from polyrl.analysis.results_doc import compare_command
from polyrl.tracking.chart_view import load_chart_view, view_key_in_url
from polyrl.tracking.mlflow_runs import ExperimentTracker

STEPS = 4
EVAL_STEPS = (0, 2, 4)  # the periodic eval: the starting policy at step 0, then every 2 steps
# Per seed: an offset both arms share (seeds differ), and wide's own noise (so differences vary).
SHARED = {0: 0.0, 1: 0.05, 2: 0.1}
OWN = {0: 0.01, 1: -0.01, 2: 0.0}


def _experiment(
    uri: str, name: str, tokens_per_step: dict[str, dict[int, float]], *, counters: bool = True, noise: dict[str, dict] = None
) -> None:
    """Arms × seeds; a run that samples ``t`` tokens per step has ``reward/mean`` and
    ``eval/toy/accuracy`` = (its cumulative tokens) / 1000 + SHARED[seed] + its noise at every
    logged step: the same curve against tokens for every arm. With ``counters`` each step logs
    compute/generated_tokens (= t · step), compute/learner_flops (1000 per generated token) and
    compute/seconds (0.1 per step); without, the run looks like one from before polyrl logged them.
    Seed ``None``: one run per arm (the arm's run trains, no seed runs)."""
    tracker = ExperimentTracker(uri, name)
    parent = tracker.start_parent(name)
    for arm, by_seed in tokens_per_step.items():
        arm_run = tracker.start_arm(parent.run_id, arm)
        for seed, per_step in by_seed.items():
            run = arm_run if seed is None else tracker.start_arm(arm_run.run_id, arm, seed=seed)
            run.log_params({"train.steps": STEPS})
            offset = SHARED.get(seed, 0.0) + (noise or {}).get(arm, {}).get(seed, 0.0)
            for step in range(0 if 0 in EVAL_STEPS else 1, STEPS + 1):
                tokens = per_step * step
                metrics = {"eval/toy/accuracy": tokens / 1000 + offset} if step in EVAL_STEPS else {}
                if step > 0:  # a training step
                    metrics |= {"reward/mean": tokens / 1000 + offset, "perf/step_s": 0.1}
                    if counters:
                        metrics |= {
                            "compute/generated_tokens": tokens,
                            "compute/learner_flops": 1000.0 * tokens,
                            "compute/seconds": 0.1 * step,
                        }
                run.log_step(step, metrics)
            if seed is not None:
                run.finish()
        arm_run.finish()
    parent.finish()


def _differences(comparison) -> dict[str, tuple[float, float, float]]:
    """metric -> (estimate, low, high) of wide − narrow."""
    return {
        key: (d.interval.estimate, d.interval.low, d.interval.high)
        for key, a, b, d, _, _ in comparison.differences
        if (a, b) == ("wide", "narrow")
    }


def test_equal_steps_favour_the_arm_that_samples_more_and_equal_tokens_do_not(tmp_path, mlflow_uri):
    seeds = (0, 1, 2)
    _experiment(
        mlflow_uri,
        "work",
        {"wide": {s: 200.0 for s in seeds}, "narrow": {s: 100.0 for s in seeds}},
        noise={"wide": OWN},
    )
    # At equal steps (step 4): wide = 800/1000 + SHARED + OWN, narrow = 400/1000 + SHARED; per-seed
    # differences 0.4 + OWN = [0.41, 0.39, 0.40]: mean 0.4, sd 0.01, half-width t(0.975, 2) · 0.01/√3
    # = 4.3027 · 0.0057735 = 0.02484, so [0.375, 0.425]: wide is higher.
    by_step = compare_experiment("work", tracking_uri=mlflow_uri, out_dir=tmp_path / "step", log_to_mlflow=False)
    estimate, low, high = _differences(by_step)["reward/mean"]
    assert estimate == pytest.approx(0.4) and low == pytest.approx(0.37516, abs=1e-4) and high == pytest.approx(0.42484, abs=1e-4)
    assert by_step.axis == "step" and by_step.budget is None
    # At equal generated tokens: every run reached 400 (narrow's 4 × 100; wide's 4 × 200 = 800), so
    # wide is read at step 2 (400 tokens) and narrow at step 4: 0.4 + SHARED + OWN against
    # 0.4 + SHARED; per-seed differences OWN = [0.01, -0.01, 0]: mean 0, the same half-width
    # 0.02484, so [-0.0248, 0.0248] contains 0 — no arm is better per token.
    by_tokens = compare_experiment(
        "work", tracking_uri=mlflow_uri, out_dir=tmp_path / "tokens", log_to_mlflow=False, axis="tokens"
    )
    assert by_tokens.axis == "tokens" and by_tokens.budget == 400.0
    differences = _differences(by_tokens)
    for key in ("reward/mean", "eval/toy/accuracy"):  # the eval metric is looked up at its eval steps: 2 and 4
        estimate, low, high = differences[key]
        assert estimate == pytest.approx(0.0, abs=1e-12), key
        assert low == pytest.approx(-0.02484, abs=1e-4) and high == pytest.approx(0.02484, abs=1e-4), key
    report = (tmp_path / "tokens" / "report.md").read_text()
    assert "## Final values (at 400 generated tokens, the most every run reached)" in report
    assert "last logged point at or before 400 generated tokens" in report and "no interpolation" in report
    assert "wide: 2 of 4 (seed 0), 2 of 4 (seed 1), 2 of 4 (seed 2); narrow: 4 of 4 (seed 0)" in report
    assert "not distinguishable from noise" in report and "wide is higher" not in report
    # The final table: narrow's mean over seeds of 0.4 + SHARED = (0.4 + 0.45 + 0.5) / 3 = 0.45.
    row = next(line for line in by_tokens.table_markdown.splitlines() if line.startswith("| narrow "))
    assert "| 0.45 ± " in row
    assert (tmp_path / "tokens" / "reward_mean.png").exists() and "--axis tokens" in compare_command(by_tokens)


def test_the_budget_is_the_smallest_final_counter_and_values_are_not_interpolated(tmp_path, mlflow_uri):
    # One run per arm; narrow samples 90 tokens a step: its final 4 × 90 = 360 is the smallest.
    _experiment(mlflow_uri, "budget", {"wide": {None: 200.0}, "narrow": {None: 90.0}})
    comparison = compare_experiment("budget", tracking_uri=mlflow_uri, out_dir=tmp_path / "r", log_to_mlflow=False, axis="tokens")
    assert comparison.budget == 360.0
    # wide's counter is 200 at step 1 and 400 at step 2: its last point at or before 360 is step 1,
    # reward 200/1000 = 0.2 (interpolating towards step 2 would give 0.36); narrow's is its step 4,
    # 360/1000 = 0.36. Its last eval within the budget is step 0 (the starting policy): 0.
    assert comparison.headline["wide/reward/mean/final"] == pytest.approx(0.2)
    assert comparison.headline["narrow/reward/mean/final"] == pytest.approx(0.36)
    assert comparison.headline["wide/eval/toy/accuracy/final"] == pytest.approx(0.0)
    assert comparison.headline["narrow/eval/toy/accuracy/final"] == pytest.approx(0.36)
    report = (tmp_path / "r" / "report.md").read_text()
    assert "## Final values (at 360 generated tokens, the most every run reached)" in report
    assert "(narrow's final count)" in report and "wide: 1 of 4; narrow: 4 of 4" in report
    # On the learner-FLOPs axis (1000 per token) the budget is 360,000; by steps both end at step 4.
    flops = compare_experiment("budget", tracking_uri=mlflow_uri, out_dir=tmp_path / "f", log_to_mlflow=False, axis="flops")
    assert flops.budget == 360_000.0 and flops.headline["wide/reward/mean/final"] == pytest.approx(0.2)
    steps = compare_experiment("budget", tracking_uri=mlflow_uri, out_dir=tmp_path / "s", log_to_mlflow=False)
    assert steps.headline["wide/reward/mean/final"] == pytest.approx(0.8)
    # Seconds: both ran 4 steps of 0.1 s, so the budget is 0.4 s and each is read at its last step.
    seconds = compare_experiment("budget", tracking_uri=mlflow_uri, out_dir=tmp_path / "t", log_to_mlflow=False, axis="seconds")
    assert seconds.budget == pytest.approx(0.4) and seconds.headline["wide/reward/mean/final"] == pytest.approx(0.8)


def test_runs_without_the_counters_are_refused_naming_the_metric(tmp_path, mlflow_uri):
    _experiment(mlflow_uri, "older", {"grpo": {0: 100.0, 1: 100.0}, "dapo": {0: 100.0, 1: 100.0}}, counters=False)
    with pytest.raises(AxisError) as refused:
        compare_experiment("older", tracking_uri=mlflow_uri, out_dir=tmp_path / "r", log_to_mlflow=False, axis="tokens")
    said = str(refused.value)
    assert "the metric compute/generated_tokens" in said and "4 of the 4 compared runs did not log" in said
    assert "grpo seed 0 (run `" in said and "--axis step" in said
    with pytest.raises(AxisError, match="--axis 'gpus' is not an axis; allowed: step, tokens, flops, seconds"):
        axis_named("gpus")
    # By step the same runs compare as before.
    assert compare_experiment("older", tracking_uri=mlflow_uri, out_dir=tmp_path / "s", log_to_mlflow=False).budget is None


def test_the_chart_view_plots_against_the_counter(tmp_path, mlflow_uri):
    _experiment(mlflow_uri, "view", {"wide": {0: 200.0, 1: 200.0}, "narrow": {0: 100.0, 1: 100.0}})
    comparison = compare_experiment("view", tracking_uri=mlflow_uri, out_dir=tmp_path / "r", axis="tokens")
    client = MlflowClient(mlflow_uri)
    experiment_id = client.get_run(comparison.parent_run_id).info.experiment_id
    state = load_chart_view(client, experiment_id, view_key_in_url(comparison.compare_url))
    lines = [card for card in state["compareRunCharts"] if card["type"] == "LINE"]
    assert lines and all(
        (card["xAxisKey"], card["selectedXAxisMetricKey"]) == ("metric", "compute/generated_tokens") for card in lines
    )
    assert state["globalLineChartConfig"]["selectedXAxisMetricKey"] == "compute/generated_tokens"
    # The view draws the arm runs (their seeds' per-step mean): each holds the counter's mean too.
    wide_run = comparison.arms["wide"]
    assert [
        (m.step, m.value) for m in sorted(client.get_metric_history(wide_run, "compute/generated_tokens"), key=lambda m: m.step)
    ] == [
        (1, 200.0),
        (2, 400.0),
        (3, 600.0),
        (4, 800.0),
    ]


def test_counter_lookup_and_example_files_at_the_budget():
    counter = {1: 100.0, 2: 200.0, 4: 400.0}
    # Step 0 (the starting policy's eval) precedes every training step; step 3 logged no counter:
    # the last one before it (step 2) holds.
    assert [x_at(counter, step) for step in (0, 1, 3, 4)] == [0.0, 100.0, 200.0, 400.0]
    budget = Budget(AXES["tokens"], 300.0, {"a": {0: "run"}}, {"run": counter})
    files = [
        "eval_examples/toy/step_0.jsonl",
        "eval_examples/toy/step_2.jsonl",
        "eval_examples/toy/step_2.polyrl-eval.jsonl",
        "eval_examples/toy/step_4.jsonl",
    ]
    rows = [{"run_id": "run", "suite": "toy", "file": path, "id": i} for i, path in enumerate(files)]
    # Step 4 (400 tokens) is past the budget; of step 2's files the polyrl-eval one is kept.
    assert [row["file"] for row in budget.example_rows(rows)] == ["eval_examples/toy/step_2.polyrl-eval.jsonl"]


def test_cli_takes_the_axis_and_says_where_the_values_were_taken(tmp_path, mlflow_uri):
    from typer.testing import CliRunner

    from polyrl.cli.main import app

    _experiment(mlflow_uri, "cli", {"wide": {None: 200.0}, "narrow": {None: 90.0}})
    runner = CliRunner()
    args = ["compare", "cli", "--out", str(tmp_path / "r"), "--tracking-uri", mlflow_uri]
    by_tokens = runner.invoke(app, [*args, "--axis", "tokens"])
    assert by_tokens.exit_code == 0, by_tokens.output
    assert "at 360 generated tokens, the most every run reached" in " ".join(by_tokens.output.split())
    wrong = runner.invoke(app, [*args, "--axis", "gpus"])
    assert wrong.exit_code != 0 and "allowed: step, tokens, flops, seconds" in " ".join(wrong.output.split())
