"""What `polyrl compare` leaves in MLflow and in docs/results.md, on a real SQLite store:
headline figures as parent-run metrics, the chart view the printed URL opens, sample links on
each arm run, and the experiment's section of the results document."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from polyrl.analysis.compare import compare_experiment, experiment_compare_url
from polyrl.analysis.results_doc import markers, write_results
from polyrl.tracking.chart_view import load_chart_view, run_ids_in_filter, seeds_view_key, view_key_in_url
from polyrl.tracking.mlflow_runs import NOTE_TAG, ExperimentTracker

STEPS = 3


def _experiment(uri: str, name: str, finals: dict[str, dict[int, float]] | dict[str, float]) -> dict[str, list[str]]:
    """Arms (× seeds when ``finals[arm]`` is a dict) whose ``reward/mean`` and
    ``eval/arith/accuracy`` end at the given value; each run logs a sample table at every step.
    Returns the ids of the runs that trained, by arm."""
    tracker = ExperimentTracker(uri, name)
    parent = tracker.start_parent(name)
    parent.set_tags({"polyrl.config_path": f"experiments/{name}.yaml"})
    trained: dict[str, list[str]] = {}
    for arm, by_seed in finals.items():
        arm_run = tracker.start_arm(parent.run_id, arm)
        runs = (
            [(tracker.start_arm(arm_run.run_id, arm, seed=seed), final) for seed, final in by_seed.items()]
            if isinstance(by_seed, dict)
            else [(arm_run, by_seed)]
        )
        for run, final in runs:
            run.log_params(
                {
                    "train.steps": STEPS,
                    "description": "Does the objective matter?",
                    "objective.name": arm,
                    "model.builtin.size": "0.3m",
                    "seed": 0,
                }
            )
            for step in range(1, STEPS + 1):
                value = final if step == STEPS else 0.0
                run.log_step(
                    step,
                    {
                        "reward/mean": value,
                        "eval/arith/accuracy": value / 100,
                        "perf/step_s": 0.1,
                        "rollout/response_length/mean": 10.0 + step,
                    },
                )
            for step in (2, STEPS):  # the last one is linked
                run.log_table([{"prompt": "1+1", "completion": "2", "reward": 1.0}], f"samples/step_{step:05d}.json")
            run.finish()
            trained.setdefault(arm, []).append(run.run_id)
        if run is not arm_run:
            arm_run.finish()
    parent.finish()
    return trained


def test_parent_metrics_chart_view_and_sample_links(tmp_path, mlflow_uri):
    _experiment(mlflow_uri, "paired", {"grpo": {0: 1.0, 1: 1.0}, "dr_grpo": {0: 1.0, 1: 1.0}})  # an older run: not in the view
    trained = _experiment(mlflow_uri, "paired", {"grpo": {0: 10.0, 1: 20.0, 2: 30.0}, "dr_grpo": {0: 8.0, 1: 17.0, 2: 26.0}})
    comparison = compare_experiment("paired", tracking_uri=mlflow_uri, out_dir=tmp_path / "r")
    client = MlflowClient(mlflow_uri)
    metrics = client.get_run(comparison.parent_run_id).data.metrics
    # grpo finals 10, 20, 30: mean 20, s = 10, s/√3 = 5.7735, t(0.975, 2) = 4.3027 -> 20 ± 24.841.
    assert metrics["grpo/reward/mean/final"] == pytest.approx(20.0)
    assert metrics["grpo/reward/mean/ci_low"] == pytest.approx(-4.841, abs=1e-3)
    assert metrics["grpo/reward/mean/ci_high"] == pytest.approx(44.841, abs=1e-3)
    assert metrics["grpo/eval/arith/accuracy/final"] == pytest.approx(0.2)
    # Paired differences 2, 3, 4: mean 3, s = 1, t · s/√3 = 2.484 -> [0.516, 5.484].
    assert metrics["diff/grpo_minus_dr_grpo/reward/mean/estimate"] == pytest.approx(3.0)
    assert metrics["diff/grpo_minus_dr_grpo/reward/mean/ci_low"] == pytest.approx(0.516, abs=1e-3)
    # The printed URL opens the chart view of this run's arm runs (not the older run's), ungrouped (the
    # mean over seeds, each in its arm's colour), held-out accuracy first, then the response length and
    # reward; the seed runs grouped by arm are the second saved view.
    assert "compareRunsMode=CHART" in comparison.compare_url and "#/experiments/" in comparison.compare_url
    experiment_id = client.get_run(comparison.parent_run_id).info.experiment_id
    state = load_chart_view(client, experiment_id, view_key_in_url(comparison.compare_url))
    assert sorted(run_ids_in_filter(state["searchFilter"])) == sorted(comparison.arms.values())
    assert state["groupBy"] is None
    seeds = load_chart_view(client, experiment_id, seeds_view_key(comparison.parent_run_id))
    assert sorted(run_ids_in_filter(seeds["searchFilter"])) == sorted(trained["grpo"] + trained["dr_grpo"])
    assert seeds["groupBy"] == {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": "polyrl.arm"}]}
    charts = [chart["metricKey"] for chart in state["compareRunCharts"]]
    assert charts[:3] == ["eval/arith/accuracy", "rollout/response_length/mean", "reward/mean"]
    assert experiment_compare_url("paired", tracking_uri=mlflow_uri) == comparison.compare_url
    # The parent run's description opens with the headline, above the UI's "Show more".
    note = client.get_run(comparison.parent_run_id).data.tags[NOTE_TAG]
    assert note.split("\n\n")[1].startswith("**eval/arith/accuracy**: grpo 0.2 [-0.0484, 0.448] · dr_grpo 0.17 [")
    # Each arm run links straight to the last sample table of each of its seed runs.
    note = client.get_run(comparison.arms["grpo"]).data.tags[NOTE_TAG]
    for run_id in trained["grpo"]:
        assert f"#/experiments/{experiment_id}/runs/{run_id}/artifacts/samples/step_00003.json" in note


def test_results_section_is_written_and_only_its_section_is_rewritten(tmp_path, mlflow_uri):
    _experiment(mlflow_uri, "seeded", {"grpo": {0: 10.0, 1: 20.0, 2: 30.0}, "dr_grpo": {0: 8.0, 1: 17.0, 2: 26.0}})
    _experiment(mlflow_uri, "single", {"grpo": 4.0, "dr_grpo": 2.0})
    client = MlflowClient(mlflow_uri)
    results = tmp_path / "docs" / "results.md"
    write_results(results, client, compare_experiment("seeded", tracking_uri=mlflow_uri, out_dir=tmp_path / "r1"))
    write_results(results, client, compare_experiment("single", tracking_uri=mlflow_uri, out_dir=tmp_path / "r2"))
    text = results.read_text()
    seeded = text.split(markers("seeded")[0])[1].split(markers("seeded")[1])[0]
    assert "**Question.** Does the objective matter?" in seeded and "`model.builtin.size=0.3m`" in seeded
    assert "**Scale.** polyrl's built-in 0.3m policy" in seeded and "experiment file `experiments/seeded.yaml`" in seeded
    assert "**Seeds.** grpo: 0, 1, 2; dr_grpo: 0, 1, 2." in seeded
    assert "| grpo | 3 | 0.2 [-0.0484, 0.448] |" in seeded  # eval/arith/accuracy: (10, 20, 30) / 100
    assert "| reward/mean | grpo − dr_grpo | 3 | [0.516, 5.48] (paired) |" in seeded
    assert "![eval_arith_accuracy](results/seeded/eval_arith_accuracy.png)" in seeded
    assert (tmp_path / "docs" / "results" / "seeded" / "eval_arith_accuracy.png").stat().st_size > 5000
    # The accuracy difference 0.03 [0.00516, 0.0548] excludes 0, but not after Holm over 3 comparisons
    # (p 0.037 × 3 = 0.11); at the same spread (s = 0.01) 4 seeds would do: t(1 − 0.05/6, 3) · 0.01/√4 = 0.0243 < 0.03.
    assert "- eval/arith/accuracy: grpo vs dr_grpo: not distinguishable from noise after Holm's correction" in seeded
    assert (
        "- eval/arith/accuracy (grpo − dr_grpo, 3 seeds): the interval excludes 0 but not after Holm's correction "
        "(adjusted p = 0.11)"
    ) in seeded and "about 4 seeds would resolve it" in seeded
    assert "- rollout/response_length/mean (grpo − dr_grpo, 3 seeds): no difference at all" in seeded
    single = text.split(markers("single")[0])[1]
    assert "| grpo | 1 | 0.04 |" in single and "One seed per arm: nothing here separates the arms" in single
    # Text written by hand stays; comparing "single" again rewrites only its section.
    results.write_text(text.replace("# Results\n", "# Results\n\nA note written by hand.\n"))
    _experiment(mlflow_uri, "single", {"grpo": 5.0, "dr_grpo": 2.0})
    write_results(results, client, compare_experiment("single", tracking_uri=mlflow_uri, out_dir=tmp_path / "r3"))
    again = results.read_text()
    assert "A note written by hand." in again and again.count(markers("single")[0]) == 1
    assert "| grpo | 1 | 0.05 |" in again and "| grpo | 1 | 0.04 |" not in again
    assert again.split(markers("seeded")[0])[1].split(markers("seeded")[1])[0] == seeded


def test_a_named_pretrained_model_is_not_described_as_the_tiny_builtin_policy():
    from polyrl.analysis.results_doc import setting_lines

    # The flattened config of `model: {builtin: {name: smollm2-135m-instruct}}` still holds the tiny
    # policies' default size (0.3m): the section must name the model and make no "built-in 0.3m" claim.
    params = {
        "model.builtin.name": "smollm2-135m-instruct",
        "model.builtin.size": "0.3m",
        "model.builtin.task": "arithmetic",
        "data.source": "arithmetic_chat_free",
    }
    text = "\n".join(setting_lines(params, {"grpo": "grpo"}, None))
    assert "`model.builtin.name=smollm2-135m-instruct`" in text and "0.3m" not in text and "**Scale.**" not in text
    tiny = "\n".join(setting_lines({"model.builtin.size": "0.3m", "model.builtin.name": "None"}, {}, None))
    assert "`model.builtin.size=0.3m`" in tiny and "**Scale.** polyrl's built-in 0.3m policy" in tiny
