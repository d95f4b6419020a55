"""Counterfactual reward replay (polyrl/analysis/replay.py, polyrl/tracking/replay_store.py,
``polyrl replay``): stored groups re-scored under other rewards, advantages compared by hand; a
tiny run's own store replayed with a changed weight."""

from __future__ import annotations

import gzip
import json

import pytest
import yaml
from typer.testing import CliRunner

from polyrl.analysis.replay import ReplayError, parse_steps, replay, select_steps
from polyrl.cli.main import app
from polyrl.config.schema import ConfigError, resolve_arms, to_yaml
from polyrl.tracking.replay_store import ReplayStore, read_store, store_path

TWO_REWARDS = [
    {"module": "length", "params": {"unit": "chars"}},
    {"module": "format", "params": {"pattern": "a", "match": "search"}},
]


def _header(rewards=TWO_REWARDS, **advantage) -> dict:
    raw = {"name": "stored", "model": {"path": "/models/m"}, "rewards": rewards, "advantage": advantage}
    cfg = resolve_arms(raw)["main"]
    labels = ["length", "format"][: len(rewards)]
    return {"run_id": "r1", "arm": "main", "weights": {label: spec.weight for label, spec in zip(labels, cfg.rewards)},
            "config": yaml.safe_load(to_yaml(cfg))}  # fmt: skip


def _group(g: int, rows: list[tuple[str, float, float]]) -> dict:
    """A stored group: (text, length score, format score) per sample."""
    return {"g": g, "prompt": f"prompt {g}", "refs": [], "fields": {}, "images": 0,
            "samples": [{"text": t, "ids": [1] * 3, "scores": {"length": a, "format": b}, "finish": "stop", "n": 3}
                        for t, a, b in rows]}  # fmt: skip


# Stored under length + format (weights 1, 1); the candidate pays format nothing (weight 0).
RECORDS = {
    1: {"step": 1, "groups": [
        # Old totals (1.1, 0.2, 0.3): mean 0.5333 -> (+1.149, -0.676, -0.473).
        # New totals (0.1, 0.2, 0.3): mean 0.2 -> (-1, 0, +1). Samples 0 and 2 flip sign; sample 1 goes to 0
        # (not a flip). Spearman of old (1.149, -0.676, -0.473) and new (-1, 0, 1): ranks (3, 1, 2) and
        # (1, 2, 3), d = (2, -1, -1), 1 - 6 * 6 / (3 * 8) = -0.5.
        _group(0, [("x0", 0.1, 1.0), ("x1", 0.2, 0.0), ("x2", 0.3, 0.0)]),
        # Old (1.2, 0.2) -> (+0.707, -0.707); new (0.2, 0.2): all 0, the group becomes uniform.
        _group(1, [("y0", 0.2, 1.0), ("y1", 0.2, 0.0)]),
    ]},
    2: {"step": 2, "groups": [
        # Old (1.1, 1.3) and new (0.1, 0.3): (-0.707, +0.707) both; Spearman 1.
        _group(2, [("z0", 0.1, 1.0), ("z1", 0.3, 1.0)]),
        # Old (0.5, 0.5): uniform; new (0.1, 0.3) -> (-0.707, +0.707): stops being uniform.
        _group(3, [("w0", 0.1, 0.4), ("w1", 0.3, 0.2)]),
    ]},
}  # fmt: skip
FORMAT_UNPAID = {"rewards": [TWO_REWARDS[0], {**TWO_REWARDS[1], "weight": 0.0}]}


def test_a_changed_weight_counted_by_hand_per_step_and_overall():
    report = replay(_header(), RECORDS, FORMAT_UNPAID, top=3)
    one, two, overall = report.steps[1], report.steps[2], report.overall
    # Step 1: 5 samples, 2 flips; Spearman over group 0 only (group 1 becomes uniform): -0.5.
    assert (one["samples"], one["groups"]) == (5, 2)
    assert one["sign_change_share"] == pytest.approx(2 / 5)
    assert (one["spearman_mean"], one["spearman_groups"]) == (pytest.approx(-0.5), 1)
    assert (one["became_uniform"], one["stopped_uniform"]) == (1, 0)
    # Step 2: no flip (0 -> ±0.707 is no sign change); Spearman 1 over group 2; group 3 stops being uniform.
    assert two["sign_change_share"] == 0
    assert (two["spearman_mean"], two["spearman_groups"]) == (pytest.approx(1.0), 1)
    assert (two["became_uniform"], two["stopped_uniform"]) == (0, 1)
    # Overall: 2 flips of 9; Spearman (-0.5 + 1) / 2 = 0.25 over 2 groups.
    assert overall["sign_change_share"] == pytest.approx(2 / 9)
    assert overall["spearman_mean"] == pytest.approx(0.25)
    assert (overall["became_uniform"], overall["stopped_uniform"], overall["groups"]) == (1, 1, 4)
    # Most moved: x0, +1.149 -> -1 (|d| 2.149); then x2, -0.473 -> +1 (1.473).
    assert [m["text"] for m in report.top[:2]] == ["x0", "x2"]
    assert report.top[0]["old_advantage"] == pytest.approx(1.1487, abs=1e-3)
    assert report.top[0]["new_advantage"] == pytest.approx(-1.0, abs=1e-4)
    assert report.top[0]["old_scores"] == {"length": 0.1, "format": 1.0}
    # Same modules and params: the stored scores were reused, nothing re-run.
    assert (report.reused, report.rescored, report.score_seconds) == (["format", "length"], [], 0.0)


def test_the_top_samples_groups_are_kept_whole_for_the_inspector_page():
    from polyrl.analysis.replay_page import movers_page

    report = replay(_header(), RECORDS, FORMAT_UNPAID, top=2)
    # The two that moved most, x0 and x2, share step 1's group 0: one group on the page, all three
    # of its samples (x1 was ranked against them), before and after.
    assert [(m["text"], m["page_group"]) for m in report.top] == [("x0", 0), ("x2", 0)]
    (group,) = report.groups
    assert (group["step"], group["group"], group["prompt"]) == (1, 0, "prompt 0")
    assert [s["text"] for s in group["samples"]] == ["x0", "x1", "x2"]
    # Old (+1.149, -0.676, -0.473) -> new (-1, 0, +1), as counted in the test above.
    assert [round(s["old_advantage"], 3) for s in group["samples"]] == [1.149, -0.676, -0.473]
    assert [round(s["new_advantage"], 3) for s in group["samples"]] == [-1.0, 0.0, 1.0]
    assert group["samples"][0]["new_scores"] == {"length": 0.1, "format": 1.0}
    page = movers_page(report.groups, title="replay")
    assert "step 1 group 0 · advantage +1.149 → -1.000" in page
    assert '"run:format"' in page and '"new:format"' in page


def test_the_same_rewards_change_nothing():
    report = replay(_header(), RECORDS, {"rewards": TWO_REWARDS})
    assert report.overall["sign_change_share"] == 0 and report.overall["spearman_mean"] == pytest.approx(1.0)
    assert report.overall["became_uniform"] == report.overall["stopped_uniform"] == 0
    assert all(m["old_advantage"] == pytest.approx(m["new_advantage"], abs=1e-6) for m in report.top)


def test_a_new_reward_is_run_on_the_stored_texts():
    # format with pattern "x" (search): x0, x1, x2 score 1, the others 0. Candidate: length + that.
    records = {1: RECORDS[1]}
    candidate = {
        "rewards": [TWO_REWARDS[0], {"module": "format", "name": "has_x", "params": {"pattern": "x", "match": "search"}}]
    }
    report = replay(_header(), records, candidate, top=10)
    assert report.reused == ["length"] and report.rescored == ["has_x"]
    new_scores = {m["text"]: m["new_scores"]["has_x"] for m in report.top}
    assert new_scores == {"x0": 1.0, "x1": 1.0, "x2": 1.0, "y0": 0.0, "y1": 0.0}
    # Group 0 new totals (1.1, 1.2, 1.3): the same order as length alone: (-1, 0, +1); group 1: (0.2, 0.2) uniform.
    assert report.steps[1]["became_uniform"] == 1
    assert report.score_seconds > 0


def test_gdpo_separates_the_papers_combinations_that_the_stored_sum_tied():
    # Two binary rewards, two samples per prompt: (0,0),(0,1) and (0,0),(1,1). The run's sum gives both
    # prompts (-0.707, +0.707); GDPO (-0.548, +0.548) and (-1.095, +1.095) (tests/algos/test_gdpo.py).
    records = {1: {"step": 1, "groups": [_group(0, [("a", 0, 0), ("b", 0, 1)]), _group(1, [("c", 0, 0), ("d", 1, 1)])]}}
    report = replay(_header(), records, {"rewards": TWO_REWARDS, "advantage": {"reward_aggregation": "gdpo"}}, top=4)
    new = {m["text"]: m["new_advantage"] for m in report.top}
    old = {m["text"]: m["old_advantage"] for m in report.top}
    assert old == pytest.approx({"a": -0.70711, "b": 0.70711, "c": -0.70711, "d": 0.70711}, abs=1e-4)
    assert new == pytest.approx({"a": -0.54772, "b": 0.54772, "c": -1.09545, "d": 1.09545}, abs=1e-4)
    assert report.overall["sign_change_share"] == 0 and report.overall["spearman_mean"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("candidate", "says"),
    [
        ({"reward": []}, "expected a mapping with a rewards: list"),
        ({"rewards": TWO_REWARDS, "train": {"steps": 2}}, "train: not a replay setting"),
        (
            {"rewards": TWO_REWARDS, "advantage": {"estimator": "rloo"}},
            "not a replay setting; allowed: advantage.reward_aggregation",
        ),
        ({"rewards": TWO_REWARDS[:1], "advantage": {"reward_aggregation": "gdpo"}}, "advantage.reward_aggregation"),
        ({"rewards": [{"module": "no_such_reward"}]}, "no_such_reward"),
    ],
)
def test_a_candidate_that_cannot_replay_is_refused_naming_why(candidate, says):
    with pytest.raises((ReplayError, ConfigError, ValueError)) as error:
        replay(_header(), RECORDS, candidate, source="other.yaml")
    assert says in str(error.value)


def test_a_run_with_a_critic_cannot_replay():
    header = _header()
    header["config"]["objective"] = {"name": "ppo"}
    with pytest.raises(ReplayError, match="'gae' needs values"):
        replay(header, RECORDS, {"rewards": TWO_REWARDS})


def test_steps_option():
    assert parse_steps("3:7") == (3, 7) and parse_steps("3:") == (3, None) and parse_steps(":2") == (None, 2)
    assert parse_steps("4") == (4, 4) and parse_steps(None) == (None, None)
    assert list(select_steps(RECORDS, 2, None)) == [2]
    with pytest.raises(ReplayError, match="expected a:b"):
        parse_steps("a-b")


def test_the_store_reads_back_what_was_appended_and_survives_a_cut_last_write(tmp_path):
    path = store_path(tmp_path / "arm")
    store = ReplayStore(path)
    store.start({"run_id": "r1", "weights": {"length": 1.0}, "config": {}})
    store.append(RECORDS[1])
    store.append(RECORDS[2])
    store.append({**RECORDS[2], "groups": RECORDS[2]["groups"][:1]})  # a resumed run wrote step 2 again
    header, steps = read_store(path)
    assert header["run_id"] == "r1" and list(steps) == [1, 2]
    assert len(steps[2]["groups"]) == 1  # the last copy wins
    # A process killed mid-write leaves a cut gzip member: the steps before it still read.
    with path.open("ab") as handle:
        handle.write(gzip.compress(json.dumps({"step": 3, "groups": []}).encode())[:-6])
    assert list(read_store(path)[1]) == [1, 2]
    # The same run resuming keeps the file; another run in the same folder starts it again.
    ReplayStore(path).start({"run_id": "r1"})
    assert list(read_store(path)[1]) == [1, 2]
    ReplayStore(path).start({"run_id": "r2"})
    assert read_store(path)[0]["run_id"] == "r2" and read_store(path)[1] == {}


# --- a tiny run's own store ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_tiny_run_keeps_its_groups_and_replays_with_a_changed_weight(tmp_path, tiny_experiment, write_experiment, monkeypatch):
    from polyrl.launch.runner import run_experiment

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = tiny_experiment(rewards=TWO_REWARDS, train={"steps": 2, "learning_rate": 1e-2, "micro_batch_size": 8})
    result = run_experiment(write_experiment(tmp_path, config), show_progress=False)
    assert not result.failed
    header, steps = read_store(store_path(tmp_path / "runs" / "tiny" / "main"))
    assert header["run_id"] == result.arm_run_ids["main"] and header["weights"] == {"length": 1.0, "format": 1.0}
    assert list(steps) == [1, 2]
    for record in steps.values():
        assert len(record["groups"]) == 4 and all(len(g["samples"]) == 4 for g in record["groups"])
        for sample in (s for g in record["groups"] for s in g["samples"]):
            # Each reward's raw score is the one its module gives the stored text.
            assert sample["scores"]["length"] == pytest.approx(len(sample["text"]) / 100)
            assert sample["scores"]["format"] == (1.0 if "a" in sample["text"] else 0.0)
            assert sample["ids"] and sample["finish"] in ("stop", "length")

    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"rewards": [TWO_REWARDS[0], {**TWO_REWARDS[1], "weight": 0.1}]}))
    out = tmp_path / "replay.json"
    run_ref = f"run:{result.arm_run_ids['main']}"
    uri = config["tracking"]["uri"]
    cli = CliRunner().invoke(
        app, ["replay", run_ref, "--rewards", str(other), "--steps", "1:2", "--json", str(out), "--tracking-uri", uri]
    )
    assert cli.exit_code == 0, cli.output
    assert "reward replay" in cli.output and "reused stored scores: format, length" in cli.output
    # Each top sample names its group on the inspector page written beside (default path).
    page = tmp_path / "reports" / "replay" / result.arm_run_ids["main"] / "movers.html"
    assert page.is_file() and "movers.html#group=0" in cli.output
    report = json.loads(out.read_text())
    assert set(report["steps"]) == {"1", "2"} and report["overall"]["samples"] == 32
    assert 0 <= report["overall"]["sign_change_share"] <= 1
    # A step the store does not hold is said, not an empty table.
    cli = CliRunner().invoke(app, ["replay", run_ref, "--rewards", str(other), "--steps", "9:", "--tracking-uri", uri])
    assert cli.exit_code == 2 and "none in '9:'" in cli.output


def _episode(solved: bool, calls: int, end: str, returned: float) -> dict:
    episode = {"turns": [], "return": returned, "solved": solved, "assistant_turns": 2, "tool_calls": calls,
               "tool_errors": 0, "end": end}  # fmt: skip
    return {"text": "...", "ids": [1, 2], "scores": {"env": returned}, "finish": "stop", "n": 2, "episode": episode}


def test_the_calculator_studys_episodes_replayed_with_the_format_reward_paid_only_for_an_answer():
    from pathlib import Path

    from polyrl.config.schema import load_experiment

    root = Path(__file__).resolve().parents[2] / "experiments"
    cfg = load_experiment(root / "real" / "calculator_grpo.yaml")["main"]
    header = {"run_id": "r1", "arm": "main", "weights": {"env": 1.0}, "config": yaml.safe_load(to_yaml(cfg))}
    # Returns as the study paid them: 1 for a right answer + 0.1 once for a call that ran.
    group_0 = [_episode(False, 1, "max_turns", 0.1), _episode(True, 1, "done", 1.1), _episode(False, 0, "done", 0.0)]
    group_1 = [_episode(False, 2, "max_turns", 0.1), _episode(False, 1, "done", 0.1), _episode(False, 0, "done", 0.0)]
    groups = [{"g": g, "prompt": "What is 397 * 98?", "refs": ["38906"], "fields": {}, "images": 0, "samples": s}
              for g, s in enumerate([group_0, group_1])]  # fmt: skip
    candidate = yaml.safe_load((root / "replay" / "calculator_answered_format.yaml").read_text())
    report = replay(header, {1: {"step": 1, "groups": groups}}, candidate, base_dir=root / "replay", top=6)
    assert report.rescored == ["solved", "answered_tool_call"]
    # New rewards: group 0 (0, 1.1, 0), group 1 (0, 0.1, 0): a call without an answer earns nothing.
    new = [(m["group"], m["new_scores"]["solved"], m["new_scores"]["answered_tool_call"]) for m in report.top]
    assert sorted(new) == [(0, 0.0, 0.0), (0, 0.0, 0.0), (0, 1.0, 1.0), (1, 0.0, 0.0), (1, 0.0, 0.0), (1, 0.0, 1.0)]
    # Group 0: old (0.1, 1.1, 0) and new (0, 1.1, 0): signs (-, +, -) both. Group 1: old (0.1, 0.1, 0) ->
    # (+, +, -); new (0, 0.1, 0) -> (-, +, -): the call that never answered flips. 1 of 6.
    assert report.overall["sign_change_share"] == pytest.approx(1 / 6)
    # Spearman on average ranks: group 0 old (2, 3, 1), new (1.5, 3, 1.5) -> 1.5 / sqrt(2 * 1.5) = 0.866;
    # group 1 old (2.5, 2.5, 1), new (1.5, 3, 1.5) -> 0.75 / 1.5 = 0.5. Mean 0.683.
    assert report.overall["spearman_mean"] == pytest.approx((1.5 / 3**0.5 + 0.5) / 2, abs=1e-4)


def test_a_run_paid_only_for_answers_replayed_with_the_studys_first_reward():
    """The other way round: episodes of calculator_answered.yaml (0.1 only on an answer after a call)
    under the first study's reward (0.1 for a call that ran, answered or not)."""
    from pathlib import Path

    from polyrl.config.schema import load_experiment

    root = Path(__file__).resolve().parents[2] / "experiments"
    cfg = load_experiment(root / "real" / "calculator_answered.yaml")["main"]
    header = {"run_id": "r2", "arm": "main", "weights": {"env": 1.0}, "config": yaml.safe_load(to_yaml(cfg))}
    # Returns as the answer-gated run paid them: called then cut at max_turns 0; called then a wrong
    # answer 0.1; answered wrong without a call 0.
    group = [_episode(False, 1, "max_turns", 0.0), _episode(False, 1, "done", 0.1), _episode(False, 0, "done", 0.0)]
    groups = [{"g": 0, "prompt": "What is 397 * 98?", "refs": ["38906"], "fields": {}, "images": 0, "samples": group}]
    candidate = yaml.safe_load((root / "replay" / "calculator_call_format.yaml").read_text())
    report = replay(header, {1: {"step": 1, "groups": groups}}, candidate, base_dir=root / "replay", top=3)
    assert report.rescored == ["solved", "tool_call_ran"]
    assert sorted(m["new_scores"]["tool_call_ran"] for m in report.top) == [0.0, 1.0, 1.0]
    # Old totals (0, 0.1, 0): signs (-, +, -). New (0.1, 0.1, 0): (+, +, -). The episode that called and
    # never answered flips to +: what the first study paid for. 1 of 3.
    assert report.overall["sign_change_share"] == pytest.approx(1 / 3)
    flipped = [m for m in report.top if m["old_advantage"] < 0 < m["new_advantage"]]
    assert len(flipped) == 1 and flipped[0]["new_scores"] == {"solved": 0.0, "tool_call_ran": 1.0}
