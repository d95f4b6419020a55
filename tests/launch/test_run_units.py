"""Seeds as an experiment axis: config, the MLflow hierarchy, the report over seeds, resume."""

from __future__ import annotations

import io
import json
import math

import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console

from polyrl.analysis.compare import compare_experiment, experiment_compare_url
from polyrl.config.schema import ConfigError
from polyrl.config.seeds import experiment_seeds, parse_seeds_option
from polyrl.launch.runner import run_experiment
from polyrl.tracking.chart_view import load_chart_view, run_ids_in_filter, seeds_view_key, view_key_in_url
from polyrl.tracking.mlflow_runs import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, NOTE_TAG
from polyrl.tracking.ui_links import run_ids_in_compare_url

# No Ray here (polyrl submit with seeds is in test_distributed.py, on that file's cluster): these
# tests stay out of the serial Ray group.


def test_seeds_key_and_option():
    assert experiment_seeds({"seeds": 3}) == [0, 1, 2]
    assert experiment_seeds({"seeds": [4, 7]}) == [4, 7]
    assert experiment_seeds({}) is None  # no seeds: one run per arm, as before
    # --seeds wins over the file's seeds and its seed.
    assert experiment_seeds({"seeds": 3, "seed": 5}, option="0,2") == [0, 2]
    assert experiment_seeds({"seed": 5}, option="2") == [0, 1]
    assert parse_seeds_option("7,") == [7]


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"seeds": 0}, "seeds: a seed count must be >= 1"),
        ({"seeds": [1, 1]}, "seeds repeat"),
        ({"seeds": [-1]}, "seeds: got [-1]; allowed"),
        ({"seeds": True}, "seeds: got True"),
        ({"seeds": 2, "seed": 3}, "seed: set together with seeds"),
        ({"seeds": 2, "arms": {"a": {"seed": 3}}}, "arms.a.seed: set together with seeds"),
    ],
)
def test_bad_seeds_are_refused_with_the_field(raw, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        experiment_seeds(raw, source="exp.yaml")


def test_compare_url_round_trip():
    from polyrl.tracking.ui_links import compare_runs_url

    url = compare_runs_url("http://127.0.0.1:5000/", "7", ["a1", "b2"])
    # The UI's own Compare button route, JSON lists URL-quoted, in model-training mode.
    assert url == (
        "http://127.0.0.1:5000/#/compare-runs?runs=%5B%22a1%22%2C%20%22b2%22%5D&experiments=%5B%227%22%5D"
        "&workflowType=machine_learning"
    )
    assert run_ids_in_compare_url(url) == ["a1", "b2"]


def test_bad_seeds_option_is_refused():
    with pytest.raises(ConfigError, match="--seeds 'x'"):
        parse_seeds_option("x")


def _two_arms(tiny_experiment, **overrides):
    config = tiny_experiment(name="seeded", train={"steps": 2}, **overrides)
    config.pop("seed")
    config["arms"] = {"grpo": {"objective": {"name": "grpo"}}, "dr_grpo": {"objective": {"name": "dr_grpo"}}}
    return config


@pytest.mark.slow
def test_two_seeds_two_arms_make_the_hierarchy_and_a_report_with_bands(tmp_path, tiny_experiment, write_experiment, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _two_arms(tiny_experiment)
    config["seeds"] = 2
    result = run_experiment(write_experiment(tmp_path, config), show_progress=False)
    uri = config["tracking"]["uri"]
    client = MlflowClient(uri)

    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert client.get_experiment(parent.info.experiment_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert result.seeds == [0, 1] and set(result.arm_run_ids) == {"grpo", "dr_grpo"}
    for arm, arm_run_id in result.arm_run_ids.items():
        arm_run = client.get_run(arm_run_id)
        assert arm_run.data.tags["mlflow.parentRunId"] == result.parent_run_id
        assert arm_run.data.tags["polyrl.role"] == "arm" and arm_run.info.status == "FINISHED"
        assert arm_run.data.params["seeds"] == "0,1" and "seed" not in arm_run.data.params
        seed_values = []
        for seed in (0, 1):
            run_id = result.seed_run_ids[f"{arm}/seed_{seed}"]
            run = client.get_run(run_id)
            assert run.data.tags["mlflow.parentRunId"] == arm_run_id
            assert run.data.tags["polyrl.seed"] == str(seed) and run.data.params["seed"] == str(seed)
            assert run.info.status == "FINISHED"
            assert (tmp_path / "runs" / "seeded" / arm / f"seed_{seed}" / "step_000002").is_dir()
            seed_values.append([m.value for m in client.get_metric_history(run_id, "reward/mean")])
        # The arm's run carries the per-step mean over its seeds.
        arm_curve = [m.value for m in sorted(client.get_metric_history(arm_run_id, "reward/mean"), key=lambda m: m.step)]
        assert arm_curve == pytest.approx([(a + b) / 2 for a, b in zip(*seed_values)], rel=1e-9)
    # The two seeds of one arm differ (the seed reaches sampling), else the bands would be empty.
    grpo = [client.get_metric_history(result.seed_run_ids[f"grpo/seed_{s}"], "reward/mean")[-1].value for s in (0, 1)]
    assert grpo[0] != grpo[1]

    comparison = compare_experiment("seeded", tracking_uri=uri, out_dir=tmp_path / "report")
    assert comparison.seed_runs == {
        arm: {0: result.seed_run_ids[f"{arm}/seed_0"], 1: result.seed_run_ids[f"{arm}/seed_1"]} for arm in ("grpo", "dr_grpo")
    }
    report = (tmp_path / "report" / "report.md").read_text()
    assert "mean over seeds, shaded 95% CI" in report and "IQM" in report
    row = next(line for line in comparison.table_markdown.splitlines() if line.startswith("| dr_grpo "))
    dr_finals = [client.get_metric_history(result.seed_run_ids[f"dr_grpo/seed_{s}"], "reward/mean")[-1].value for s in (0, 1)]
    assert row.split("|")[2].strip() == "2"
    assert f"{sum(dr_finals) / 2:.3g} ± " in row
    assert "| reward/mean | grpo − dr_grpo |" in report
    assert any(v.startswith("grpo vs dr_grpo: ") for v in comparison.verdicts)
    assert any(
        "not distinguishable from noise at 2 seeds" in v
        or "interval excludes 0 at 2 seeds" in v
        or "after Holm's correction" in v
        for v in comparison.verdicts
    )
    assert "(paired)" in report and "Holm's step-down method" in report  # both arms ran seeds 0 and 1
    assert (tmp_path / "report" / "reward_mean.png").stat().st_size > 5000
    # The parent run's description is the report, its plots read from the run's artifacts.
    note = client.get_run(result.parent_run_id).data.tags[NOTE_TAG]
    assert f"get-artifact?path=comparison/reward_mean.png&run_uuid={result.parent_run_id}" in note
    assert "| reward/mean | grpo − dr_grpo |" in note
    logged = {a.path for a in client.list_artifacts(result.parent_run_id, "comparison")}
    assert {"comparison/report.md", "comparison/reward_mean.png"} <= logged
    # The URL opens MLflow's chart view of the arm runs (one line per arm: the mean over its seeds);
    # the seed runs grouped by arm are the second saved view.
    assert "compareRunsMode=CHART" in comparison.compare_url
    experiment_id = client.get_run(result.parent_run_id).info.experiment_id
    state = load_chart_view(client, experiment_id, view_key_in_url(comparison.compare_url))
    arm_runs = {client.get_run(run_id).data.tags["mlflow.parentRunId"] for run_id in result.seed_run_ids.values()}
    assert sorted(run_ids_in_filter(state["searchFilter"])) == sorted(arm_runs) and state["groupBy"] is None
    seeds = load_chart_view(client, experiment_id, seeds_view_key(result.parent_run_id))
    assert sorted(run_ids_in_filter(seeds["searchFilter"])) == sorted(result.seed_run_ids.values())
    assert seeds["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "polyrl.arm"}]
    # The parent run carries the headline figures: grpo's mean final reward over its 2 seeds, with bounds.
    metrics = client.get_run(result.parent_run_id).data.metrics
    assert metrics["grpo/reward/mean/final"] == pytest.approx(sum(grpo) / 2)
    assert metrics["grpo/reward/mean/ci_low"] <= metrics["grpo/reward/mean/final"] <= metrics["grpo/reward/mean/ci_high"]
    url = experiment_compare_url("seeded", tracking_uri=uri, base_url="http://127.0.0.1:5123")
    assert url.startswith("http://127.0.0.1:5123/#/experiments/") and url.endswith("&workflowType=machine_learning")


@pytest.mark.slow
def test_seeds_option_overrides_and_resume_skips_finished_seeds(tmp_path, tiny_experiment, write_experiment, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tiny_experiment(name="resumed", train={"steps": 2})  # seed: 0 in the file; --seeds overrides it
    path = write_experiment(tmp_path, config)
    first = run_experiment(path, show_progress=False, seeds_option="0,1")
    assert first.seeds == [0, 1] and set(first.seed_run_ids) == {"main/seed_0", "main/seed_1"}
    folder = tmp_path / "runs" / "resumed"
    # As if the process had died during seed 1: its run and the arm's run are unfinished.
    state_path = folder / "experiment.json"
    state = json.loads(state_path.read_text())
    state["finished"].remove("main/seed_1")
    state["arms_finished"].remove("main")
    state_path.write_text(json.dumps(state))
    for step in (folder / "main" / "seed_1").glob("step_*"):
        for file in step.iterdir():
            file.unlink()
        step.rmdir()
    seed_0_checkpoint = folder / "main" / "seed_0" / "step_000002"
    stamp = max(f.stat().st_mtime_ns for f in seed_0_checkpoint.iterdir())

    with pytest.raises(ConfigError, match=r"used seeds \[0, 1\].*give seeds \[0, 1, 2\]"):
        run_experiment(path, show_progress=False, resume=True, seeds_option="3")
    output = io.StringIO()
    again = run_experiment(path, show_progress=False, resume=True, seeds_option="0,1", console=Console(file=output, width=200))
    text = output.getvalue()
    assert "main/seed_0 already finished; skipping" in text
    assert "main/seed_1" not in again.final_metrics or again.final_metrics["main/seed_1"]  # seed 1 trained again
    assert set(again.final_metrics) == {"main/seed_1"}
    assert again.seed_run_ids == first.seed_run_ids and again.parent_run_id == first.parent_run_id
    assert max(f.stat().st_mtime_ns for f in seed_0_checkpoint.iterdir()) == stamp  # seed 0 untouched
    assert (folder / "main" / "seed_1" / "step_000002").is_dir()
    client = MlflowClient(config["tracking"]["uri"])
    assert client.get_run(again.arm_run_ids["main"]).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(again.seed_run_ids["main/seed_1"], "reward/mean")] == [1, 2]
    assert not math.isnan(client.get_run(again.arm_run_ids["main"]).data.metrics["reward/mean"])
