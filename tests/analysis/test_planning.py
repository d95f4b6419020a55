"""Planning seeds from a pilot's sd: the fixed design's exact t power against G*Power's published
sample sizes, the sequential budget's simulated power, and the wall time."""

from __future__ import annotations

import pytest

from polyrl.analysis.planning import (
    PlanningError,
    fixed_power,
    fixed_seeds,
    plan_seeds,
    seeds_needed,
    simulate_plan,
    wall_minutes,
)
from polyrl.analysis.sequential import SequentialPlan, SequentialPlanError


def test_fixed_design_matches_the_paired_t_sample_sizes():
    # Paired t, two-sided α = 0.05, power 0.8 (G*Power, "means: difference between two dependent
    # means"): effect size 1 needs 10 pairs (power 0.803), 0.5 needs 34 (power 0.808). The normal
    # approximation ((1.96 + 0.84) / d)² says 7.85 and 31.4: too few at a handful of seeds.
    assert fixed_seeds(1.0, 1.0) == 10 and fixed_power(10, sd=1, effect=1, alpha=0.05) == pytest.approx(0.8031, abs=1e-4)
    assert fixed_power(9, sd=1, effect=1, alpha=0.05) < 0.8
    assert fixed_seeds(0.2, 0.1) == 34 and fixed_power(34, sd=2, effect=1, alpha=0.05) == pytest.approx(0.8078, abs=1e-4)
    # No effect: the power is the level itself.
    assert fixed_power(5, sd=1, effect=0.0, alpha=0.05) == pytest.approx(0.05, abs=1e-12)
    # Bonferroni over 2 comparisons (each at 0.025) needs more seeds.
    assert fixed_seeds(1.0, 1.0, comparisons=2) == 13


def test_the_sequential_budget_is_the_smallest_with_the_power():
    found = plan_seeds(1.0, 1.0)
    assert (found.fixed, found.max) == (10, 12)
    assert found.power >= 0.8 and found.fixed <= found.max and found.expected <= found.max
    # One seed less (the budget in rounds of 1) misses the power, on the same simulated experiments.
    smaller = SequentialPlan(max_seeds=found.max - 1)
    assert simulate_plan(smaller, sd=1.0, true_difference=1.0, sesoi=1.0).different < 0.8
    # With no difference the plan keeps its error rate and stops early when it can say "equivalent".
    assert found.at_no_difference.different <= 0.05 + 3 * (0.05 * 0.95 / 20_000) ** 0.5
    assert found.at_no_difference.expected_seeds < found.max
    assert tuple(seeds_needed(1.0, 1.0)) == (found.fixed, found.expected, found.max)


def test_rounds_of_two_give_a_budget_in_whole_rounds():
    found = plan_seeds(1.0, 1.0, seeds_per_round=2, spending="pocock")
    assert found.max % 2 == 0 and found.power >= 0.8 and found.plan.spending == "pocock"


def test_wall_time_is_seeds_times_arms_times_minutes():
    assert wall_minutes(10, 2, 15.0) == 300.0  # 10 seeds × 2 arms × 15 min
    with pytest.raises(PlanningError, match="arms = 1"):
        wall_minutes(10, 1, 15.0)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"sd_of_differences": 0.0}, PlanningError, "sd_of_differences = 0.0"),
        ({"effect": -1.0}, PlanningError, "effect = -1.0"),
        ({"power": 1.0}, PlanningError, "power = 1.0"),
        ({"spending": "linear"}, SequentialPlanError, "SequentialPlan.spending"),
        ({"alpha": 0.0}, SequentialPlanError, "SequentialPlan.alpha"),
    ],
)
def test_bad_inputs_are_refused_by_name(kwargs, error, message):
    with pytest.raises(error, match=message):
        plan_seeds(**({"sd_of_differences": 1.0, "effect": 1.0} | kwargs))
