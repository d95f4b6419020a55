"""until_resolved: seeds in rounds, a decision after each round, the sequence kept across a resume."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from polyrl.config.schema import ConfigError
from polyrl.config.until_resolved import until_resolved_plan
from polyrl.launch.rounds import order_in_rounds
from polyrl.launch.run_units import RunUnit
from polyrl.launch.runner import run_experiment, validate_file

ARMS = ["grpo", "dr_grpo"]


def _block(**overrides):
    block = {"comparisons": [{"arms": ["grpo", "dr_grpo"], "metric": "reward/mean", "sesoi": 0.1}], "max_seeds": 4}
    block.update(overrides)
    return block


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"seeds": 3, "until_resolved": _block()}, "until_resolved: set together with seeds"),
        ({"until_resolved": _block(comparisons=[{"arms": ["grpo", "ppo"], "metric": "m", "sesoi": 1}])}, "no arm 'ppo'"),
        ({"until_resolved": _block(comparisons=[{"arms": ["grpo", "grpo"], "metric": "m", "sesoi": 1}])}, "compared with itself"),
        ({"until_resolved": _block(max_seeds=4, seeds_per_round=5)}, "seeds_per_round \\(5\\) is larger than max_seeds"),
        ({"until_resolved": _block(alpha=0.7)}, "until_resolved.alpha"),
        ({"until_resolved": _block(comparisons=[{"arms": ["grpo", "dr_grpo"], "metric": "m", "sesoi": 0}])}, "sesoi"),
        ({"until_resolved": _block(spending="haybittle")}, "until_resolved.spending"),
        ({"until_resolved": [1]}, "expected a mapping"),
    ],
)
def test_bad_until_resolved_blocks_are_refused_with_the_field(raw, message):
    with pytest.raises(ConfigError, match=message):
        until_resolved_plan(raw, ARMS, source="exp.yaml")


def test_rounds_are_seed_major_and_cover_the_budget():
    plan = until_resolved_plan({"until_resolved": _block(max_seeds=5, seeds_per_round=2, first_seed=10)}, ARMS)
    assert plan.rounds() == [[10, 11], [12, 13], [14]]  # the last round is shorter, ending at max_seeds
    units = [RunUnit(arm, seed, None) for arm in ARMS for seed in plan.seeds()]  # arm-major, as expand_units gives
    rounds = order_in_rounds(units, plan)
    assert [[u.key for u in r] for r in rounds][0] == ["grpo/seed_10", "dr_grpo/seed_10", "grpo/seed_11", "dr_grpo/seed_11"]
    assert sum(len(r) for r in rounds) == 10


def _experiment(tiny_experiment, block):
    config = tiny_experiment(name="sequential", train={"steps": 2})
    config.pop("seed")
    config["arms"] = {"grpo": {"objective": {"name": "grpo"}}, "dr_grpo": {"objective": {"name": "dr_grpo"}}}
    config["until_resolved"] = block
    # One after another, in this process: these tests follow the rounds' bookkeeping, and which
    # runs a sitting starts (side by side a free core starts the next round early:
    # tests/launch/test_seeds_at_once.py).
    config["seeds_at_once"] = 1
    return config


@pytest.mark.slow
def test_a_settled_comparison_stops_the_rounds_and_a_resume_keeps_the_sequence(
    tmp_path, tiny_experiment, write_experiment, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    # reward/mean of a 2-step run lies in [0, 1] (the length reward): a SESOI of 100 is met by
    # any interval the first look can give, so the comparison is "equivalent" at 2 seeds and
    # seeds 2 and 3 of the budget of 4 never run.
    block = _block(comparisons=[{"arms": ["grpo", "dr_grpo"], "metric": "reward/mean", "sesoi": 100.0}], max_seeds=4)
    config = _experiment(tiny_experiment, block)
    path = write_experiment(tmp_path, config)
    assert set(validate_file(path)) == {"grpo", "dr_grpo"}
    result = run_experiment(path, show_progress=False)
    assert sorted(result.seed_run_ids) == ["dr_grpo/seed_0", "dr_grpo/seed_1", "grpo/seed_0", "grpo/seed_1"]
    state = json.loads((tmp_path / "runs" / "sequential" / "experiment.json").read_text())
    assert [r["seeds"] for r in state["sequential"]] == [1, 2]  # a decision after each round
    first, second = state["sequential"]
    assert first["decisions"]["grpo-vs-dr_grpo:reward/mean"]["verdict"] == "undecided"  # one seed: no look
    decision = second["decisions"]["grpo-vs-dr_grpo:reward/mean"]
    assert decision["verdict"] == "equivalent" and decision["n"] == 2
    client = MlflowClient(config["tracking"]["uri"])
    finals = {key: client.get_metric_history(run_id, "reward/mean")[-1].value for key, run_id in result.seed_run_ids.items()}
    # The decision's differences are the paired per-seed finals, grpo − dr_grpo, in seed order.
    assert decision["differences"] == pytest.approx([finals[f"grpo/seed_{s}"] - finals[f"dr_grpo/seed_{s}"] for s in (0, 1)])
    parent = client.get_run(result.parent_run_id)
    assert "equivalent within ±100" in parent.data.tags["polyrl.sequential.seeds_002"]
    assert parent.info.status == "FINISHED"
    for arm_run_id in result.arm_run_ids.values():
        assert client.get_run(arm_run_id).info.status == "FINISHED"

    # compare shows the sequence, round by round, beside its fixed-sample tables.
    from polyrl.analysis.compare import compare_experiment

    compare_experiment("sequential", tracking_uri=config["tracking"]["uri"], out_dir=tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Seeds added until resolved" in report
    assert "| 1 | grpo-vs-dr_grpo:reward/mean | no look yet (a look needs 2 seeds) | undecided |" in report
    assert "| 2 | grpo-vs-dr_grpo:reward/mean |" in report and "equivalent within ±100" in report

    # A resume trains nothing and keeps the same sequence: no round counted twice.
    again = run_experiment(path, resume=True, show_progress=False)
    state_again = json.loads((tmp_path / "runs" / "sequential" / "experiment.json").read_text())
    assert state_again["sequential"][-1]["decisions"] == state["sequential"][-1]["decisions"]
    assert [r["seeds"] for r in state_again["sequential"]] == [1, 2]
    assert sorted(again.seed_run_ids) == sorted(result.seed_run_ids)
    assert sorted(state_again["finished"]) == sorted(state["finished"])


@pytest.mark.slow
def test_hours_spent_stop_the_rounds_and_a_resume_continues_them(tmp_path, tiny_experiment, write_experiment, monkeypatch):
    monkeypatch.chdir(tmp_path)
    block = _block(comparisons=[{"arms": ["grpo", "dr_grpo"], "metric": "reward/mean", "sesoi": 100.0}], max_seeds=3)
    config = _experiment(tiny_experiment, block | {"max_hours": 1e-6})
    path = write_experiment(tmp_path, config)
    first = run_experiment(path, show_progress=False)
    assert sorted(first.seed_run_ids) == ["dr_grpo/seed_0", "grpo/seed_0"]  # one round, then the hours were spent
    # More hours on resume: the sequence goes on from seed 1 (seed 0 is not trained again).
    config["until_resolved"].pop("max_hours")
    write_experiment(tmp_path, config)
    second = run_experiment(path, resume=True, show_progress=False)
    assert sorted(second.seed_run_ids) == ["dr_grpo/seed_0", "dr_grpo/seed_1", "grpo/seed_0", "grpo/seed_1"]
    assert second.seed_run_ids["grpo/seed_0"] == first.seed_run_ids["grpo/seed_0"]
    state = json.loads((tmp_path / "runs" / "sequential" / "experiment.json").read_text())
    assert [r["seeds"] for r in state["sequential"]] == [1, 2]
    assert state["sequential"][-1]["decisions"]["grpo-vs-dr_grpo:reward/mean"]["verdict"] == "equivalent"
    # The arm runs, closed over one seed by the first sitting, now hold the means over both: they
    # kept the one-seed means before (the steps were logged already, so the new ones were skipped).
    client = MlflowClient(config["tracking"]["uri"])
    for arm in ("grpo", "dr_grpo"):
        arm_run = client.get_run(second.arm_run_ids[arm])
        assert arm_run.data.metrics["seeds/n"] == 2
        finals = [client.get_metric_history(second.seed_run_ids[f"{arm}/seed_{s}"], "reward/mean") for s in (0, 1)]
        last = [max(history, key=lambda m: m.step).value for history in finals]
        assert arm_run.data.metrics["reward/mean"] == pytest.approx(sum(last) / 2)
    # A SESOI changed after the data were seen is refused on resume (max_hours was allowed to change).
    config["until_resolved"]["comparisons"][0]["sesoi"] = 0.01
    write_experiment(tmp_path, config)
    with pytest.raises(ConfigError, match="until_resolved.comparisons: was .*'sesoi': 100.0.*now .*'sesoi': 0.01"):
        run_experiment(path, resume=True, show_progress=False)


def test_the_sequence_section_lists_every_round():
    from polyrl.analysis.sequential_report import sequential_section

    rounds = [
        {"seeds": 1, "decisions": {"a-vs-b:m": {"verdict": "undecided", "n": 1, "look": None}}, "sentences": ["m: no look"]},
        {
            "seeds": 2,
            "decisions": {"a-vs-b:m": {"verdict": "different", "mean": 0.25, "low": 0.125, "high": 0.375}},
            "sentences": ["m: a is better than b"],
            "missing": ["b seed 3 (run `x`): FAILED"],
        },
    ]
    text = sequential_section(rounds)
    assert "- m: a is better than b" in text
    assert "| 2 | a-vs-b:m | 0.25 [0.125, 0.375] | different |" in text
    assert "Seed runs left out: b seed 3" in text


def test_submit_refuses_until_resolved_and_run_refuses_seeds_with_it(tmp_path, tiny_experiment, write_experiment):
    # polyrl submit runs an experiment's arm × seed tasks side by side: it would have run each arm
    # once, as if the block were not there. Refused before Ray starts.
    from polyrl.launch.ray_submit import submit_experiment

    path = write_experiment(tmp_path, _experiment(tiny_experiment, _block()))
    with pytest.raises(ConfigError, match="until_resolved runs seeds in rounds .* run it with polyrl run"):
        submit_experiment(path)
    with pytest.raises(ConfigError, match="--seeds 3: .* has until_resolved, whose rounds decide the seeds"):
        run_experiment(path, seeds_option="3", show_progress=False)
