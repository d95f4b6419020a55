"""``polyrl compare --baseline ARM``: each arm against one arm, Holm's correction over those
comparisons only (a 9-arm league table has 36 pairs: corrected over all of them, no verdict
stands); ``--metrics`` restricts the compared metrics; both are written into the results
section's command, so running it again gives the same section."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from polyrl.analysis.compare import CompareError, compare_experiment
from polyrl.analysis.difference_tables import compared_pairs
from polyrl.analysis.results_doc import write_results
from polyrl.core.errors import PolyrlError
from polyrl.tracking.mlflow_runs import ExperimentTracker

STEPS = 2
# Final reward/mean per arm and seed. Per-seed differences (seeds 0, 1, 2):
#   dapo − grpo = [3, 4, 5]: mean 4, sd 1, se 1/√3, t = 6.928 on 2 df, two-sided p = 0.020204
#   gspo − grpo = [1, 0, 2]: mean 1, sd 1, t = 1.732, p = 0.225403
#   dapo − gspo = [2, 4, 3]: mean 3, sd 1, t = 5.196, p = 0.035099
# (interval of dapo − grpo: 4 ± t(0.975, 2) · 1/√3 = 4 ± 4.3027 · 0.57735 = [1.516, 6.484]).
FINALS = {
    "grpo": {0: 10.0, 1: 20.0, 2: 30.0},
    "dapo": {0: 13.0, 1: 24.0, 2: 35.0},
    "gspo": {0: 11.0, 1: 20.0, 2: 32.0},
}


def _experiment(uri: str, name: str, finals: dict[str, dict[int, float]], extra: dict[str, float] | None = None) -> None:
    """Arms × seeds with ``reward/mean`` ending at ``finals[arm][seed]`` (and ``extra`` metrics,
    the same for every run)."""
    tracker = ExperimentTracker(uri, name)
    parent = tracker.start_parent(name)
    for arm, by_seed in finals.items():
        arm_run = tracker.start_arm(parent.run_id, arm)
        for seed, final in by_seed.items():
            run = tracker.start_arm(arm_run.run_id, arm, seed=seed)
            run.log_params({"train.steps": STEPS})
            for step in range(1, STEPS + 1):
                run.log_step(step, {"reward/mean": final if step == STEPS else 0.0, "perf/step_s": 0.1, **(extra or {})})
            run.finish()
        arm_run.finish()
    parent.finish()


def _rows(comparison) -> dict[tuple[str, str], tuple[float, float]]:
    return {(a, b): (d.interval.estimate, p) for key, a, b, d, p, _ in comparison.differences if key == "reward/mean"}


def test_compared_pairs():
    assert compared_pairs(["a", "b", "c"]) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert compared_pairs(["a", "b", "c"], "b") == [("a", "b"), ("c", "b")]


def test_baseline_compares_each_arm_with_it_and_holm_runs_over_those_only(tmp_path, mlflow_uri):
    _experiment(mlflow_uri, "league", FINALS)
    every = compare_experiment("league", tracking_uri=mlflow_uri, out_dir=tmp_path / "all", log_to_mlflow=False)
    # All pairs (3 comparisons), Holm: sorted p 0.020204, 0.035099, 0.225403 →
    #   3 × 0.020204 = 0.060612; max(0.060612, 2 × 0.035099 = 0.070197) = 0.070197; max(0.070197, 1 × 0.225403) = 0.225403.
    rows = _rows(every)
    assert list(rows) == [("grpo", "dapo"), ("grpo", "gspo"), ("dapo", "gspo")]
    assert rows[("grpo", "dapo")] == pytest.approx((-4.0, 0.060612), abs=1e-5)
    assert rows[("dapo", "gspo")] == pytest.approx((3.0, 0.070197), abs=1e-5)
    assert rows[("grpo", "gspo")] == pytest.approx((-1.0, 0.225403), abs=1e-5)
    report = (tmp_path / "all" / "report.md").read_text()
    assert "over the 3 comparisons of this report (family-wise" in report
    assert "not distinguishable from noise after Holm's correction over 3 comparisons (adjusted p = 0.061" in report

    against = compare_experiment(
        "league", tracking_uri=mlflow_uri, out_dir=tmp_path / "base", log_to_mlflow=False, baseline="grpo"
    )
    # Against grpo (2 comparisons), Holm: 2 × 0.020204 = 0.040408; max(0.040408, 1 × 0.225403) = 0.225403.
    # dapo's lead now holds (0.040 < 0.05); over all pairs it did not (0.061).
    rows = _rows(against)
    assert list(rows) == [("dapo", "grpo"), ("gspo", "grpo")]
    assert rows[("dapo", "grpo")] == pytest.approx((4.0, 0.040408), abs=1e-5)
    assert rows[("gspo", "grpo")] == pytest.approx((1.0, 0.225403), abs=1e-5)
    report = (tmp_path / "base" / "report.md").read_text()
    assert "## Differences from the baseline grpo (each arm − grpo;" in report
    assert "| reward/mean | dapo − grpo | 4 | [1.52, 6.48] (paired) | 0.04 |" in report
    assert (
        "dapo vs grpo: dapo is higher; the 95% interval excludes 0 at 3 seeds and holds after Holm's correction over 2" in report
    )
    assert "over the 2 comparisons of this report (each arm against the baseline grpo, not every pair)" in report
    # The parent run's headline differences follow the pairs: arm minus baseline.
    assert against.headline["diff/dapo_minus_grpo/reward/mean/estimate"] == pytest.approx(4.0)
    assert not any(key.startswith("diff/grpo_minus") for key in against.headline)
    with pytest.raises(CompareError, match=r"--baseline 'GRPO' is not an arm of experiment 'league'; its arms: grpo, dapo, gspo"):
        compare_experiment("league", tracking_uri=mlflow_uri, out_dir=tmp_path / "r", log_to_mlflow=False, baseline="GRPO")


def test_metrics_restrict_the_differences_and_the_results_section_records_the_command(tmp_path, mlflow_uri):
    _experiment(mlflow_uri, "league", FINALS, extra={"actor/entropy": 1.0, "train/accuracy": 0.5})
    comparison = compare_experiment(
        "league", tracking_uri=mlflow_uri, out_dir=tmp_path / "r", baseline="grpo", metrics=["reward/mean"]
    )
    # Without --metrics entropy and training accuracy would be compared too (2 more metrics × 2 arms).
    assert {row[0] for row in comparison.differences} == {"reward/mean"} and len(comparison.differences) == 2
    section = write_results(tmp_path / "results.md", MlflowClient(mlflow_uri), comparison).read_text()
    assert "`polyrl compare league --baseline grpo --metrics reward/mean --results …` (rewrites this section)" in section
    assert "### Differences from the baseline grpo" in section
    assert "| reward/mean | dapo − grpo | 4 | [1.52, 6.48] (paired) | 0.04 |" in section
    assert "- reward/mean: dapo vs grpo: dapo is higher" in section
    with pytest.raises(
        PolyrlError,
        match=r"--metrics: eval/x/accuracy is not logged .* the metrics there are: actor/entropy, perf/step_s, reward/mean,",
    ):
        compare_experiment("league", tracking_uri=mlflow_uri, out_dir=tmp_path / "r2", metrics=["eval/x/accuracy"])


def test_metrics_may_name_any_logged_metric_outside_the_default_table(tmp_path, mlflow_uri):
    """A study's own metric (the mismatch study's rollout_corr/kl) is not one of the default table's
    columns; asked for, it gets a column and differences like any other."""
    _experiment(mlflow_uri, "study", FINALS, extra={"rollout_corr/kl": 0.002})
    comparison = compare_experiment(
        "study",
        tracking_uri=mlflow_uri,
        out_dir=tmp_path / "r",
        log_to_mlflow=False,
        baseline="grpo",
        metrics=["reward/mean", "rollout_corr/kl"],
    )
    # The same kl in every run: each difference is exactly 0.
    kl = {(a, b): d.interval.estimate for key, a, b, d, _, _ in comparison.differences if key == "rollout_corr/kl"}
    assert kl == {("dapo", "grpo"): pytest.approx(0.0), ("gspo", "grpo"): pytest.approx(0.0)}
    assert "rollout_corr/kl" in (tmp_path / "r" / "report.md").read_text().split("\n", 3)[-1]
    # The results section's final table has its column: 0.002 in every seed run of every arm.
    section = write_results(tmp_path / "results.md", MlflowClient(mlflow_uri), comparison).read_text()
    header = next(line for line in section.splitlines() if line.startswith("| arm | seeds |"))
    assert header.endswith("| rollout_corr/kl |"), header
    assert "| grpo | 3 |" in section and "| 0.002 [0.002, 0.002] |" in section


def test_one_seed_per_arm_refuses_baseline(tmp_path, mlflow_uri):
    tracker = ExperimentTracker(mlflow_uri, "single")
    parent = tracker.start_parent("single")
    for arm in ("grpo", "dapo"):
        run = tracker.start_arm(parent.run_id, arm)
        run.log_step(1, {"reward/mean": 1.0})
        run.finish()
    parent.finish()
    with pytest.raises(CompareError, match="one seed per arm.*--baseline and --metrics would change nothing"):
        compare_experiment("single", tracking_uri=mlflow_uri, out_dir=tmp_path / "r", log_to_mlflow=False, baseline="grpo")


@pytest.mark.slow
def test_cli_hints_at_baseline_past_four_arms(tmp_path, mlflow_uri):
    from typer.testing import CliRunner

    from polyrl.cli.main import app

    arms = ["grpo", "dr_grpo", "dapo", "gspo", "cispo"]
    _experiment(mlflow_uri, "five", {arm: {0: float(i), 1: float(i) + 0.5} for i, arm in enumerate(arms)})
    runner = CliRunner()
    plain = runner.invoke(app, ["compare", "five", "--out", str(tmp_path / "a"), "--tracking-uri", mlflow_uri])
    assert plain.exit_code == 0, plain.output
    assert "5 arms: every pair is compared; --baseline ARM" in " ".join(plain.output.split())
    against = runner.invoke(
        app, ["compare", "five", "--out", str(tmp_path / "b"), "--tracking-uri", mlflow_uri, "--baseline", "grpo"]
    )
    assert against.exit_code == 0, against.output
    assert "--baseline ARM" not in against.output
    wrong = runner.invoke(
        app, ["compare", "five", "--out", str(tmp_path / "c"), "--tracking-uri", mlflow_uri, "--baseline", "ppo"]
    )
    assert wrong.exit_code == 2 and "its arms: grpo, dr_grpo, dapo, gspo, cispo" in " ".join(wrong.output.split())
