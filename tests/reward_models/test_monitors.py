"""Reward-hacking monitors: the pure signals against hand-computed values, and each health
warning on a constructed run that must trigger it and on a control that must not."""

from __future__ import annotations

import math
import random

import pytest

from polyrl.config.base import ConfigError
from polyrl.config.schema import ExperimentConfig
from polyrl.monitoring.health import HealthMonitor
from polyrl.rewards.monitors import change_over, component_shares, distinct_per_prompt, held_out_divergence, pearson
from polyrl.trainer.hooks import HealthHook, StepReport


def _settings(**health):
    # A held-out metric is read from periodic evaluation, which the config must then have.
    evaluation = {"eval": {"every": 2, "suite": "arithmetic"}} if "held_out_metric" in health else {}
    return ExperimentConfig(name="t", health=health, **evaluation).health


def _rows(rewards, lengths, prompts=None, completions=None):
    n = len(rewards)
    prompts = prompts or [f"p{i // 2}" for i in range(n)]
    completions = completions or [f"answer {i}" for i in range(n)]
    return [
        {"prompt": p, "completion": c, "reward": r, "length": n_} for p, c, r, n_ in zip(prompts, completions, rewards, lengths)
    ]


# -- the pure signals ------------------------------------------------------------------------


def test_pearson_hand_computed_and_undefined_cases():
    # x = 1,2,3; y = 2,4,7: centred x = -1,0,1; centred y = -7/3,-1/3,8/3;
    # Σxy = 7/3 + 8/3 = 5; Σx² = 2; Σy² = (49+1+64)/9 = 114/9; r = 5 / sqrt(2·114/9) = 5 / 5.0332 = 0.99339
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9), rel=1e-12)
    assert pearson([1, 2, None, 3], [2, 4, 100, 7]) == pytest.approx(0.99339, abs=1e-5)  # the None pair is left out
    assert pearson([1, 2], [1, 2]) is None  # two pairs
    assert pearson([1, 1, 1], [1, 2, 3]) is None  # a constant side


def test_change_over_is_the_least_squares_slope_times_the_window():
    # Points (0,0),(1,1),(2,0),(3,1): slope = Σ(s-1.5)(v-0.5)/Σ(s-1.5)² = (0.75-0.25+(-0.25)... = 1/5·... computed:
    # centred s = -1.5,-0.5,0.5,1.5; centred v = -.5,.5,-.5,.5; Σ = .75-.25-.25+.75 = 1.0; Σs² = 5; slope 0.2; ×3 = 0.6
    assert change_over([(0, 0), (1, 1), (2, 0), (3, 1)], first_step=0, last_step=3) == pytest.approx(0.6)
    assert change_over([(0, 0), (5, 1)], first_step=1, last_step=5) is None  # one point in the window


def test_component_shares_split_the_total_variance():
    # a = 0,1,2 (weight 1), b = 0,0,3 (weight 2): terms a = 0,1,2; 2b = 0,0,6; T = 0,1,8 (mean 3)
    # centred T = -3,-2,5, var sum 38; centred a = -1,0,1 → cov sum 3+0+5 = 8; centred 2b = -2,-2,4 → 6+4+20 = 30
    shares = component_shares({"a": [0, 1, 2], "b": [0, 0, 3]}, {"a": 1.0, "b": 2.0})
    assert shares == pytest.approx({"a": 8 / 38, "b": 30 / 38})
    assert sum(shares.values()) == pytest.approx(1.0)
    assert component_shares({"a": [1, 2, 3]}, {"a": 1.0}) is None  # one component


def test_distinct_per_prompt():
    assert distinct_per_prompt(["a", "a", "b", "b"], ["x", "y", "z", "w"]) == 2.0
    assert distinct_per_prompt(["a", "a", "b", "b"], ["x", "x ", "x", "x"]) == 0.5  # one text for two prompts


def test_held_out_divergence_needs_both_a_rise_and_a_stall():
    train = [(s, 0.1 * s) for s in range(11)]  # rises 1.0 over 10 steps
    falling = [(0, 0.5), (5, 0.4), (10, 0.3)]
    rising = [(0, 0.3), (5, 0.4), (10, 0.5)]
    found = held_out_divergence(train, falling, window=10, min_rise=0.05, stall=0.0)
    assert found["train_change"] == pytest.approx(1.0) and found["held_out_change"] == pytest.approx(-0.2)
    assert held_out_divergence(train, rising, window=10, min_rise=0.05, stall=0.0) is None
    flat_train = [(s, 0.5) for s in range(11)]
    assert held_out_divergence(flat_train, falling, window=10, min_rise=0.05, stall=0.0) is None


def test_held_out_divergence_early_in_a_run_reports_the_change_over_the_steps_it_has():
    # Held-out at steps 0 and 2, training reward 0 at step 1 and 1 at step 2; window 50. The window
    # is steps 0-2: train slope 1 per step x 2 steps = 2.0; held-out (0.5 -> 0.5) 0. Before, the
    # slope was multiplied by the whole window (50) although it started 48 steps before step 0.
    found = held_out_divergence([(1, 0.0), (2, 1.0)], [(0, 0.5), (2, 0.5)], window=50, min_rise=0.1, stall=0.0)
    assert found == {
        "train_change": pytest.approx(2.0),
        "held_out_change": pytest.approx(0.0),
        "first_step": 0.0,
        "last_step": 2.0,
    }
    # A rise of 0.02 per step over those 2 steps (0.04) is below a min_rise of 0.1: no warning (before: 0.02 x 50 = 1.0, a warning).
    assert held_out_divergence([(1, 0.0), (2, 0.02)], [(0, 0.5), (2, 0.5)], window=50, min_rise=0.1, stall=0.0) is None


# -- each warning: a constructed run that triggers it, a control that must not ---------------


def _run_samples(monitor, steps):
    """steps: list of (rows, parts); every warning said, in order."""
    said = []
    for step, (rows, parts) in enumerate(steps, start=1):
        metrics: dict[str, float] = {}
        said += monitor.check_samples(step, rows, parts, metrics)
    return said, metrics


def test_reward_explained_by_length_fires_and_control_stays_quiet():
    rng = random.Random(0)
    hacked, control = [], []
    for _ in range(4):
        lengths = [rng.randint(5, 60) for _ in range(16)]
        hacked.append((_rows([n / 10 + rng.gauss(0, 0.1) for n in lengths], lengths), {}))
        control.append((_rows([rng.random() for _ in lengths], lengths), {}))
    said, metrics = _run_samples(HealthMonitor(_settings()), hacked)
    assert [w.split(":")[0] for w in said] == ["reward_length"]  # once, from the third step on
    assert metrics["health/reward_length_corr"] > 0.9
    said, metrics = _run_samples(HealthMonitor(_settings()), control)
    assert said == [] and abs(metrics["health/reward_length_corr"]) < 0.8
    # The threshold is the setting's: at 0.99 the hacked run is quiet too.
    assert _run_samples(HealthMonitor(_settings(max_length_correlation=0.999)), hacked)[0] == []


def test_completion_collapse_fires_and_control_stays_quiet():
    prompts = [f"p{i // 4}" for i in range(16)]  # 4 prompts × 4 samples
    collapsed = _rows([1.0] * 16, [3] * 16, prompts, ["The answer is 7."] * 15 + ["7"])
    said, metrics = _run_samples(HealthMonitor(_settings(min_distinct_per_prompt=0.6)), [(collapsed, {})])
    assert [w.split(":")[0] for w in said] == ["completion_collapse"]
    assert metrics["health/distinct_per_prompt"] == pytest.approx(2 / 4)  # 2 texts for 4 prompts
    # ... which is below 0.6 but not below 0.5 (strict): the threshold is the setting's.
    assert _run_samples(HealthMonitor(_settings(min_distinct_per_prompt=0.5)), [(collapsed, {})])[0] == []
    control = _rows([1.0] * 16, [3] * 16, prompts, [f"answer {i // 4}" for i in range(16)])  # one text per prompt
    assert _run_samples(HealthMonitor(_settings()), [(control, {})])[0] == []


def test_component_turning_against_another_fires_and_control_stays_quiet():
    rng = random.Random(1)
    a = [rng.random() for _ in range(16)]
    together = {"accuracy": a, "judge": [x + rng.gauss(0, 0.05) for x in a]}
    against = {"accuracy": a, "judge": [1 - x + rng.gauss(0, 0.05) for x in a]}
    rows = _rows([1.0] * 16, [3] * 16)
    # a balanced total so the dominance check stays out of it
    monitor = HealthMonitor(_settings(max_component_share=1.0), reward_weights={"accuracy": 1.0, "judge": 1.0})
    said, metrics = _run_samples(monitor, [(rows, together), (rows, together), (rows, against)])
    assert [w.split(":")[0] for w in said] == ["component_against/accuracy__judge"]
    assert metrics["health/component_corr/accuracy__judge"] < -0.9
    monitor = HealthMonitor(_settings(max_component_share=1.0), reward_weights={"accuracy": 1.0, "judge": 1.0})
    assert _run_samples(monitor, [(rows, together)] * 3)[0] == []


def test_component_coming_to_dominate_fires_and_control_stays_quiet():
    rng = random.Random(2)
    rows = _rows([1.0] * 16, [3] * 16)

    def parts(spread_b):
        return {"a": [rng.random() for _ in range(16)], "b": [spread_b * rng.random() for _ in range(16)]}

    monitor = HealthMonitor(_settings(), reward_weights={"a": 1.0, "b": 1.0})
    said, metrics = _run_samples(monitor, [(rows, parts(1.0)), (rows, parts(20.0))])
    assert [w.split(":")[0] for w in said] == ["component_dominates/b"]
    assert metrics["health/component_share/b"] > 0.9
    monitor = HealthMonitor(_settings(), reward_weights={"a": 1.0, "b": 1.0})
    assert _run_samples(monitor, [(rows, parts(1.0)), (rows, parts(1.0))])[0] == []
    # The weight counts: b's raw spread is 20x, but at weight 0.05 its term is as wide as a's.
    monitor = HealthMonitor(_settings(), reward_weights={"a": 1.0, "b": 0.05})
    assert _run_samples(monitor, [(rows, parts(1.0)), (rows, parts(20.0))])[0] == []


def test_judge_drifting_from_the_rule_fires_and_control_stays_quiet():
    rng = random.Random(3)
    rows = _rows([1.0] * 16, [3] * 16)

    def step(agree: bool):
        rule = [float(rng.random() < 0.5) for _ in range(16)]
        judge = [r * 8 + 1 + rng.gauss(0, 0.5) if agree else rng.uniform(1, 9) for r in rule]
        return rows, {"judge": judge, "exact": rule}

    settings = _settings(judge_rule_pairs={"judge": "exact"}, reward_window=2, max_component_share=1.0)
    weights = {"judge": 0.1, "exact": 1.0}
    said, metrics = _run_samples(
        HealthMonitor(settings, reward_weights=weights), [step(True), step(True), step(False), step(False)]
    )
    assert [w.split(":")[0] for w in said] == ["judge_drift/judge"]
    assert metrics["health/judge_rule_corr/judge"] < 0.3
    said, metrics = _run_samples(HealthMonitor(settings, reward_weights=weights), [step(True)] * 4)
    assert said == [] and metrics["health/judge_rule_corr/judge"] > 0.9
    # One step's handful of samples is not a drift: with the default window, three steps are pooled first.
    settings = _settings(judge_rule_pairs={"judge": "exact"}, max_component_share=1.0)
    assert _run_samples(HealthMonitor(settings, reward_weights=weights), [step(False)] * 2)[0] == []
    said, _ = _run_samples(HealthMonitor(settings, reward_weights=weights), [step(False)] * 3)
    assert [w.split(":")[0] for w in said] == ["judge_drift/judge"]


def test_held_out_falling_while_reward_rises_fires_once_through_the_hook_and_control_stays_quiet():
    printed: list[str] = []

    class Tags:
        def __init__(self):
            self.tags: dict[str, str] = {}

        def set_tags(self, tags):
            self.tags.update(tags)

    def run(eval_values):
        tags = Tags()
        hook = HealthHook(HealthMonitor(_settings(reward_window=4)), arm="a", printer=printed.append, logger=tags)
        for step in range(1, 9):
            metrics = {"reward/mean": 0.1 * step}
            report = StepReport(step, metrics)
            hook.observe(report)
            if step % 2 == 0:  # the periodic evaluation, after observe
                metrics["eval/suite/accuracy"] = eval_values(step)
            hook.publish(report)
        return tags.tags, metrics

    tags, metrics = run(lambda step: 0.6 - 0.02 * step)
    assert list(tags) == ["health.held_out_divergence/eval/suite/accuracy"]
    assert metrics["health/held_out_divergence/eval/suite/accuracy_trips"] >= 2  # fired again, said once
    assert sum("held_out_divergence" in line for line in printed) == 1
    tags, _ = run(lambda step: 0.3 + 0.05 * step)
    assert tags == {}


def test_settings_name_their_field_when_they_cannot_apply():
    with pytest.raises(ConfigError, match=r"health.judge_rule_pairs: no reward is labelled 'judge'"):
        HealthMonitor(_settings(judge_rule_pairs={"judge": "exact"}), reward_weights={"exact": 1.0})
    with pytest.raises(ConfigError, match=r"health.held_out_metric"):
        HealthMonitor(_settings(held_out_metric="eval/x/accuracy"), held_out=False)


def test_state_survives_a_resume():
    rng = random.Random(4)
    a = [rng.random() for _ in range(16)]
    rows = _rows([1.0] * 16, [3] * 16)
    weights = {"accuracy": 1.0, "judge": 1.0}
    first = HealthMonitor(_settings(max_component_share=1.0), reward_weights=weights)
    _run_samples(first, [(rows, {"accuracy": a, "judge": a})])
    second = HealthMonitor(_settings(max_component_share=1.0), reward_weights=weights)
    second.load_state_dict(first.state_dict())
    said, _ = _run_samples(second, [(rows, {"accuracy": a, "judge": [1 - x for x in a]})])
    assert [w.split(":")[0] for w in said] == ["component_against/accuracy__judge"]  # the first sign came back


def test_a_held_out_metric_the_evaluation_does_not_log_is_named_once():
    monitor = HealthMonitor(_settings(held_out_metric="eval/suite/acuracy"))
    said = []
    for step in (1, 2, 3):
        said += monitor.check_held_out(step, {"reward/mean": 0.1 * step, "eval/suite/accuracy": 0.5})
    assert [w.split(":")[0] for w in said] == ["held_out_metric_missing"]
    assert "eval/suite/accuracy" in said[0]
    assert HealthMonitor(_settings(held_out_metric="eval/suite/accuracy")).check_held_out(1, {"eval/suite/accuracy": 0.5}) == []
