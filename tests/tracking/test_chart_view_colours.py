"""The saved chart view tells arms apart: each run carries its arm's colour (distinct per arm),
nothing is grouped (a group's colour is the UI's hash, not ours: seeded arms are drawn as their
arm runs, the seed runs grouped are a second view), and cards are one a
row, so their titles (metric keys) are not cut to a few letters (test_chart_view_titles.py checks
that in Chromium)."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from polyrl.analysis.compare_views import write_chart_view
from polyrl.tracking.chart_view import (
    ARM_COLOURS,
    RUN_COLOUR_TAG,
    load_chart_view,
    run_ids_in_filter,
    seeds_view_key,
    view_key_in_url,
)
from polyrl.tracking.mlflow_runs import ExperimentTracker


def _runs(uri: str, arms: dict[str, int], eval_key: str = "eval/arith/accuracy") -> tuple[str, str, list[str]]:
    """Runs that trained (seed runs under an arm run when an arm has several); seed ``s`` of the
    ``i``-th arm logs ``eval_key`` = i + s at step 1."""
    tracker = ExperimentTracker(uri, "colours")
    parent = tracker.start_parent("colours")
    run_ids = []
    for index, (arm, seeds) in enumerate(arms.items()):
        arm_run = tracker.start_arm(parent.run_id, arm)
        runs = [tracker.start_arm(arm_run.run_id, arm, seed=s) for s in range(seeds)] if seeds > 1 else [arm_run]
        for seed, run in enumerate(runs):
            run.log_step(1, {"reward/mean": 1.0, eval_key: float(index + seed)})
            run.finish()
            run_ids.append(run.run_id)
        if seeds > 1:
            arm_run.finish()
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


def test_seeded_arms_are_drawn_as_their_arm_runs_in_distinct_colours_and_the_seeds_in_a_second_view(mlflow_uri):
    experiment_id, parent_id, run_ids = _runs(mlflow_uri, {"grpo": 2, "dr_grpo": 2})
    client = MlflowClient(mlflow_uri)
    url = write_chart_view(
        client, experiment_id=experiment_id, parent_run_id=parent_id, run_ids=run_ids, eval_keys=["eval/arith/accuracy"],
        grouped=True, base_url="http://127.0.0.1:5000",
    )  # fmt: skip
    arm_ids = [
        client.get_run(run_ids[0]).data.tags["mlflow.parentRunId"],
        client.get_run(run_ids[2]).data.tags["mlflow.parentRunId"],
    ]
    colours = [client.get_run(run_id).data.tags[RUN_COLOUR_TAG] for run_id in arm_ids + run_ids]
    assert colours == [ARM_COLOURS[0], ARM_COLOURS[1]] + [ARM_COLOURS[0]] * 2 + [ARM_COLOURS[1]] * 2
    state = load_chart_view(client, experiment_id, view_key_in_url(url))
    # Not grouped: a group's colour is the UI's hash of the group, which nothing polyrl writes sets.
    assert state["groupBy"] is None
    # Only the arm runs: a shared view cannot hide runs it lists (the UI drops runsHidden from it).
    assert run_ids_in_filter(state["searchFilter"]) == arm_ids
    # The arm runs hold the held-out score's mean over their seeds: grpo (0 + 1) / 2 = 0.5,
    # dr_grpo (1 + 2) / 2 = 1.5; the launcher logs only the training metrics' means.
    means = [[(m.step, m.value) for m in client.get_metric_history(arm_id, "eval/arith/accuracy")] for arm_id in arm_ids]
    assert means == [[(1, 0.5)], [(1, 1.5)]]
    # Re-running compare logs nothing twice.
    write_chart_view(
        client, experiment_id=experiment_id, parent_run_id=parent_id, run_ids=run_ids, eval_keys=["eval/arith/accuracy"],
        grouped=True, base_url="http://127.0.0.1:5000",
    )  # fmt: skip
    assert len(client.get_metric_history(arm_ids[0], "eval/arith/accuracy")) == 1
    # The seeds grouped by arm (mean and band, the UI's colours) are the second saved view.
    seeds = load_chart_view(client, experiment_id, seeds_view_key(parent_id))
    assert seeds["groupBy"]["groupByKeys"][0]["groupByData"] == "polyrl.arm"
    assert run_ids_in_filter(seeds["searchFilter"]) == run_ids


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


def test_arm_runs_link_to_the_seeds_view(mlflow_uri):
    from polyrl.analysis.compare_views import annotate_arm_runs
    from polyrl.tracking.mlflow_runs import NOTE_TAG

    experiment_id, parent_id, run_ids = _runs(mlflow_uri, {"grpo": 2})
    client = MlflowClient(mlflow_uri)
    seeds = [client.get_run(run_id) for run_id in run_ids]
    arm = client.get_run(seeds[0].data.tags["mlflow.parentRunId"])
    annotate_arm_runs(client, experiment_id, {"grpo": arm}, {"grpo": seeds})
    note = client.get_run(arm.info.run_id).data.tags[NOTE_TAG]
    assert f"viewStateShareKey={seeds_view_key(parent_id)}&compareRunsMode=CHART" in note
