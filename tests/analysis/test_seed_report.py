"""The seed report on a real MLflow store: unfinished seed runs left out and named, arms that
share seeds compared paired, every verdict Holm-corrected and the report says so."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from polyrl.analysis.compare import compare_experiment
from polyrl.analysis.experiment_runs import seed_run_problem
from polyrl.tracking.mlflow_runs import ExperimentTracker

STEPS = 3


def _experiment(
    uri: str, name: str, finals: dict[str, dict[int, float]], *, stopped: dict[tuple[str, int], int] | None = None
) -> None:
    """Arms × seeds with ``reward/mean`` ending at ``finals[arm][seed]``; a seed in ``stopped``
    fails at that step (status FAILED, its last value 100 so a mean that counted it would show)."""
    tracker = ExperimentTracker(uri, name)
    parent = tracker.start_parent(name)
    for arm, by_seed in finals.items():
        arm_run = tracker.start_arm(parent.run_id, arm)
        for seed, final in by_seed.items():
            run = tracker.start_arm(arm_run.run_id, arm, seed=seed)
            run.log_params({"train.steps": STEPS})
            last = (stopped or {}).get((arm, seed), STEPS)
            for step in range(1, last + 1):
                value = final if step == STEPS else (100.0 if step == last else 0.0)
                run.log_step(step, {"reward/mean": value, "perf/step_s": 0.1})
            if last < STEPS:
                run.finish_after_error("FAILED", "stopped")
            else:
                run.finish()
        arm_run.finish()
    parent.finish()


def test_an_unfinished_seed_is_left_out_of_the_finals_and_named(tmp_path, mlflow_uri):
    # grpo seed 2 failed at step 1 with value 100: counted, grpo's mean would be (1 + 2 + 100) / 3.
    _experiment(
        mlflow_uri, "partial", {"grpo": {0: 1.0, 1: 2.0, 2: 3.0}, "dr_grpo": {0: 1.5, 1: 2.5, 2: 3.5}}, stopped={("grpo", 2): 1}
    )
    comparison = compare_experiment("partial", tracking_uri=mlflow_uri, out_dir=tmp_path / "r", log_to_mlflow=False)
    report = (tmp_path / "r" / "report.md").read_text()
    assert "## Seed runs left out" in report and "- grpo seed 2 (run `" in report and "FAILED, stopped at step 1 of 3" in report
    row = next(line for line in comparison.table_markdown.splitlines() if line.startswith("| grpo "))
    assert row.split("|")[2].strip() == "2" and "1.5 ± " in row  # seeds 0 and 1: (1 + 2) / 2
    # The arms no longer share every seed (grpo has 0, 1; dr_grpo 0, 1, 2): unpaired, and said so.
    assert "(Welch)" in report and "Welch: the arms do not share the same two or more finished seeds" in report


def test_arms_sharing_seeds_are_paired_and_the_report_states_the_correction(tmp_path, mlflow_uri):
    # Per-seed differences grpo − dr_grpo = [2, 3, 4] (see test_stats: paired interval (0.516, 5.484)).
    _experiment(mlflow_uri, "paired", {"grpo": {0: 10.0, 1: 20.0, 2: 30.0}, "dr_grpo": {0: 8.0, 1: 17.0, 2: 26.0}})
    compare_experiment("paired", tracking_uri=mlflow_uri, out_dir=tmp_path / "r", log_to_mlflow=False)
    report = (tmp_path / "r" / "report.md").read_text()
    assert "| reward/mean | grpo − dr_grpo | 3 | [0.516, 5.48] (paired) | 0.035 |" in report
    assert "Holm's step-down method over the 1 comparisons of this report" in report
    assert "Seed runs left out" not in report


def test_seed_run_problems_in_words():
    assert seed_run_problem("FINISHED", 100, 100) is None
    assert seed_run_problem("FAILED", 12, 100) == "FAILED, stopped at step 12 of 100"
    assert seed_run_problem("RUNNING", None, 100) == "RUNNING, no step logged"
    assert seed_run_problem("FINISHED", 12, 100) == "stopped at step 12 of 100"


def test_each_arm_gets_its_change_over_training_paired_within_the_seed(tmp_path, mlflow_uri):
    # Held-out accuracy at step 0 (the starting policy) and at the last step, per seed.
    # grpo: 0.2→0.5, 0.3→0.5, 0.25→0.6: changes [0.3, 0.2, 0.35], mean 0.28333, sd 0.076376,
    # se 0.076376/√3 = 0.044096, t(0.975, 2) = 4.3027 → half-width 0.18973: [0.0936, 0.473];
    # t = 6.425, two-sided p = 0.0234. dr_grpo: changes [0.1, −0.1, 0.0], mean 0: p = 1.
    # Holm over the 2 rows: 0.0234 × 2 = 0.047 (rose), max(0.047, 1 × 1) = 1.
    starts, ends = {0: 0.2, 1: 0.3, 2: 0.25}, {"grpo": {0: 0.5, 1: 0.5, 2: 0.6}, "dr_grpo": {0: 0.3, 1: 0.2, 2: 0.25}}
    tracker = ExperimentTracker(mlflow_uri, "rise")
    parent = tracker.start_parent("rise")
    for arm, by_seed in ends.items():
        arm_run = tracker.start_arm(parent.run_id, arm)
        for seed, end in by_seed.items():
            run = tracker.start_arm(arm_run.run_id, arm, seed=seed)
            run.log_params({"train.steps": STEPS})
            run.log_step(0, {"eval/x/accuracy": starts[seed]})
            for step in range(1, STEPS + 1):
                run.log_step(
                    step, {"reward/mean": 0.0, "perf/step_s": 0.1, **({"eval/x/accuracy": end} if step == STEPS else {})}
                )
            run.finish()
        arm_run.finish()
    parent.finish()
    comparison = compare_experiment("rise", tracking_uri=mlflow_uri, out_dir=tmp_path / "r", log_to_mlflow=False)
    report = (tmp_path / "r" / "report.md").read_text()
    assert "| eval/x/accuracy | grpo | 3 | 0.283 | [0.0936, 0.473] | 0.047 | rose (the interval excludes 0) |" in report
    assert "| eval/x/accuracy | dr_grpo | 3 | 0 | " in report and "no change distinguishable from seed noise" in report
    assert abs(comparison.headline["grpo/eval/x/accuracy/change/estimate"] - 0.28333) < 1e-4
    assert abs(comparison.headline["grpo/eval/x/accuracy/change/ci_low"] - 0.0936) < 1e-3
    # The results document carries the same change, from the headline metrics.
    from polyrl.analysis.results_doc import write_results

    document = write_results(tmp_path / "results.md", MlflowClient(mlflow_uri), comparison).read_text()
    assert "| eval/x/accuracy | grpo | 0.283 [0.0936, 0.473] | excludes 0 |" in document
    assert "| eval/x/accuracy | dr_grpo | 0 [" in document and "| contains 0 |" in document


def test_results_plots_survive_a_report_written_into_the_results_folder(tmp_path, mlflow_uri):
    """`polyrl compare NAME --out docs/results/NAME --results docs/results.md`: the report's plots
    are already where the section's plots go; they are kept (not deleted as stale, then copied
    from nowhere)."""
    from polyrl.analysis.results_doc import write_results

    _experiment(mlflow_uri, "same_folder", {"a": {0: 1.0, 1: 2.0}, "b": {0: 1.5, 1: 2.5}})
    folder = tmp_path / "results" / "same_folder"
    comparison = compare_experiment("same_folder", tracking_uri=mlflow_uri, out_dir=folder, log_to_mlflow=False)
    drawn = sorted(p.name for p in folder.glob("*.png"))
    assert drawn
    document = write_results(tmp_path / "results.md", MlflowClient(mlflow_uri), comparison).read_text()
    assert sorted(p.name for p in folder.glob("*.png")) == drawn
    assert "](results/same_folder/reward_mean.png)" in document
