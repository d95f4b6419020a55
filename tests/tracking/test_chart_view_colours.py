"""The saved chart view tells arms apart: each run carries its arm's colour (distinct per arm),
one-run arms are not grouped (a group's colour is the UI's hash, not ours), and cards are one a
row, so their titles (metric keys) are not cut to a few letters (test_chart_view_titles.py checks
that in Chromium)."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from polyrl.analysis.compare_views import write_chart_view
from polyrl.tracking.chart_view import ARM_COLOURS, RUN_COLOUR_TAG, load_chart_view, view_key_in_url
from polyrl.tracking.mlflow_runs import ExperimentTracker


def _runs(uri: str, arms: dict[str, int]) -> tuple[str, str, list[str]]:
    tracker = ExperimentTracker(uri, "colours")
    parent = tracker.start_parent("colours")
    run_ids = []
    for arm, seeds in arms.items():
        arm_run = tracker.start_arm(parent.run_id, arm)
        runs = [tracker.start_arm(arm_run.run_id, arm, seed=s) for s in range(seeds)] if seeds > 1 else [arm_run]
        for run in runs:
            run.log_step(1, {"reward/mean": 1.0})
            run.finish()
            run_ids.append(run.run_id)
    client = MlflowClient(uri)
    return client.get_run(parent.run_id).info.experiment_id, parent.run_id, run_ids


def test_one_run_per_arm_is_drawn_in_distinct_arm_colours(mlflow_uri):
    experiment_id, parent_id, run_ids = _runs(mlflow_uri, {"grpo": 1, "dr_grpo": 1})
    client = MlflowClient(mlflow_uri)
    url = write_chart_view(
        client, experiment_id=experiment_id, parent_run_id=parent_id, run_ids=run_ids, eval_keys=["eval/arith/accuracy"],
        grouped=True, base_url="http://127.0.0.1:5000",
    )  # fmt: skip
    colours = [client.get_run(run_id).data.tags[RUN_COLOUR_TAG] for run_id in run_ids]
    assert colours == list(ARM_COLOURS[:2]) and colours[0] != colours[1]
    state = load_chart_view(client, experiment_id, view_key_in_url(url))
    assert state["groupBy"] is None  # a group's colour would be the UI's hash of the group
    assert state["compareRunSections"][0]["columns"] == 1


def test_seeds_stay_grouped_and_share_their_arms_colour(mlflow_uri):
    experiment_id, parent_id, run_ids = _runs(mlflow_uri, {"grpo": 2, "dr_grpo": 2})
    client = MlflowClient(mlflow_uri)
    url = write_chart_view(
        client, experiment_id=experiment_id, parent_run_id=parent_id, run_ids=run_ids, eval_keys=[], grouped=True,
        base_url="http://127.0.0.1:5000",
    )  # fmt: skip
    colours = [client.get_run(run_id).data.tags[RUN_COLOUR_TAG] for run_id in run_ids]
    assert colours == [ARM_COLOURS[0]] * 2 + [ARM_COLOURS[1]] * 2
    assert (
        load_chart_view(client, experiment_id, view_key_in_url(url))["groupBy"]["groupByKeys"][0]["groupByData"] == "polyrl.arm"
    )


def test_other_metrics_get_sections_of_the_same_layout_named_as_the_ui_names_them():
    from polyrl.tracking.chart_view import SECTION_COLUMNS, chart_view_state

    state = chart_view_state(
        ["abc"],
        ["reward/mean", "rollout/response_length/mean"],
        group_by_tag=None,
        other_keys=["reward/mean", "rollout/response_length/mean", "rollout/response_length/clipped_ratio",
                    "actor/clip_frac_high", "actor/entropy", "system/cpu", "loss"],
    )  # fmt: skip
    sections = state["compareRunSections"]
    # The comparison section first; then one per prefix of the keys it does not show (the UI's name
    # for a generated section: the key up to its last '/'), sorted; system metrics and keys without
    # a '/' are left to the UI.
    assert [s["name"] for s in sections] == ["polyrl comparison", "actor", "rollout/response_length"]
    assert {s["columns"] for s in sections} == {SECTION_COLUMNS} and len({s["uuid"] for s in sections}) == 3
