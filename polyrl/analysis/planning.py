"""How many seeds a comparison needs, planned from a pilot's spread of paired differences.

Given the standard deviation of the per-seed paired differences (arm a − arm b at the same
seed; from a pilot experiment, :mod:`polyrl.analysis.pilot`) and the effect worth detecting:

- **fixed number of seeds**: the smallest n at which a paired two-sided t test at level
  ``alpha / comparisons`` (Bonferroni) has the asked power, computed exactly from the
  noncentral t distribution (no normal approximation: with a handful of seeds it would promise
  power the t test does not have);
- **sequential plan** (:mod:`polyrl.analysis.sequential`): the smallest seed budget
  ``max_seeds`` (whole rounds) whose plan reaches the same power, and the seeds it is expected
  to use when the true difference is the effect. Both by simulation: normal per-seed
  differences with the pilot's standard deviation, a fixed random seed, the plan's own
  verdict rule (:func:`~polyrl.analysis.sequential.sequential_outcomes`).

The wall time a plan asks for is seeds × arms × minutes per run (runs one after another).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
from scipy import stats as scipy_stats

from polyrl.analysis.sequential import SequentialPlan, sequential_outcomes
from polyrl.core.errors import PolyrlError

SIMULATED_EXPERIMENTS = 20_000  # power's simulation error: about ±0.3 points (one standard error) at 80%
SIMULATION_SEED = 0
SEEDS_LIMIT = 500


class PlanningError(PolyrlError, ValueError):
    """Planning inputs that cannot be used (the message names the argument)."""


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise PlanningError(f"{name} = {value!r}: must be a finite number > 0")
    return float(value)


def fixed_power(n: int, *, sd: float, effect: float, alpha: float) -> float:
    """Power of the two-sided paired t test at ``n`` seeds: ``P(|T| > t_{n−1, 1−α/2})`` with
    T noncentral t, n − 1 degrees of freedom, noncentrality ``effect / sd · √n``."""
    critical = scipy_stats.t.isf(alpha / 2, n - 1)
    noncentrality = effect / sd * math.sqrt(n)
    return float(scipy_stats.nct.sf(critical, n - 1, noncentrality) + scipy_stats.nct.cdf(-critical, n - 1, noncentrality))


def fixed_seeds(sd: float, effect: float, *, alpha: float = 0.05, power: float = 0.8, comparisons: int = 1) -> int:
    """The fewest seeds (≥ 2) at which the paired t test at ``alpha / comparisons`` has ``power``."""
    sd, effect = _positive("sd", sd), _positive("effect", effect)
    level = alpha / comparisons
    for n in range(2, SEEDS_LIMIT + 1):
        if fixed_power(n, sd=sd, effect=effect, alpha=level) >= power:
            return n
    raise PlanningError(f"a fixed design needs more than {SEEDS_LIMIT} seeds for effect {effect:g} at sd {sd:g}")


@dataclass(frozen=True)
class Simulated:
    """A sequential plan's operating characteristics at one true mean difference: the share of
    experiments declared different in the true direction (the power; under no difference, the
    share declared different either way), in the wrong direction, equivalent, and undecided at
    the budget, and the mean number of seeds per arm used."""

    different: float
    wrong_direction: float
    equivalent: float
    undecided: float
    expected_seeds: float


def simulate_plan(
    plan: SequentialPlan,
    *,
    sd: float,
    true_difference: float,
    sesoi: float,
    experiments: int = SIMULATED_EXPERIMENTS,
    seed: int = SIMULATION_SEED,
) -> Simulated:
    """Run ``plan`` on ``experiments`` simulated comparisons with normal per-seed differences
    (mean ``true_difference``, standard deviation ``sd``)."""
    rng = np.random.default_rng(seed)
    samples = rng.normal(true_difference, _positive("sd", sd), size=(experiments, plan.max_seeds))
    outcome = sequential_outcomes(samples, plan, sesoi)
    different = outcome.verdict == 1
    if true_difference == 0:
        right, wrong = different, np.zeros_like(different)
    else:
        right = different & (np.sign(outcome.mean) == np.sign(true_difference))
        wrong = different & ~right
    return Simulated(
        different=float(right.mean()),
        wrong_direction=float(wrong.mean()),
        equivalent=outcome.share("equivalent"),
        undecided=outcome.share("undecided"),
        expected_seeds=float(outcome.seeds.mean()),
    )


class SeedsNeeded(NamedTuple):
    """``(fixed, expected, max)``: seeds per arm for a fixed design, the seeds a sequential plan
    with the same power is expected to use when the difference is the effect, and its budget."""

    fixed: int
    expected: float
    max: int


@dataclass(frozen=True)
class SeedPlan:
    """Everything :func:`seeds_needed` found: its three numbers, the sequential plan, the power
    that plan reached (simulated) and its behaviour under no difference."""

    fixed: int
    expected: float
    max: int
    plan: SequentialPlan
    power: float
    at_effect: Simulated
    at_no_difference: Simulated
    sesoi: float


def wall_minutes(seeds: float, arms: int, minutes_per_run: float) -> float:
    """Seeds × arms × minutes per run: the training time of a plan with its runs one after another."""
    if arms < 2:
        raise PlanningError(f"arms = {arms}: a comparison needs at least 2 arms")
    return seeds * arms * _positive("minutes_per_run", minutes_per_run)


def plan_seeds(
    sd_of_differences: float,
    effect: float,
    alpha: float = 0.05,
    power: float = 0.8,
    *,
    seeds_per_round: int = 1,
    spending: str = "obrien_fleming",
    comparisons: int = 1,
    min_seeds: int = 2,
    sesoi: float | None = None,
    experiments: int = SIMULATED_EXPERIMENTS,
) -> SeedPlan:
    """The fixed design and the smallest sequential plan (budget in whole rounds, searched
    upward from the fixed design's seeds) whose simulated power at ``effect`` reaches ``power``.
    ``sesoi`` (default: ``effect``) is the plan's smallest effect of interest for equivalence."""
    sd, effect = _positive("sd_of_differences", sd_of_differences), _positive("effect", effect)
    if not 0 < power < 1:
        raise PlanningError(f"power = {power!r}: must be in (0, 1)")
    sesoi = effect if sesoi is None else _positive("sesoi", sesoi)
    # Checks alpha, spending, comparisons, rounds (SequentialPlanError naming the field) before any use.
    base = SequentialPlan(
        max_seeds=max(min_seeds, 2) if isinstance(min_seeds, int) else 2,
        seeds_per_round=seeds_per_round,
        alpha=alpha,
        spending=spending,
        comparisons=comparisons,
        min_seeds=min_seeds,
    )
    fixed = fixed_seeds(sd, effect, alpha=alpha, power=power, comparisons=comparisons)
    start = max(min_seeds, math.ceil(fixed / seeds_per_round) * seeds_per_round)
    results: dict[int, Simulated] = {}

    def reaches(max_seeds: int) -> bool:
        plan = replace(base, max_seeds=max_seeds)
        results[max_seeds] = simulate_plan(plan, sd=sd, true_difference=effect, sesoi=sesoi, experiments=experiments)
        return results[max_seeds].different >= power

    # The budget that reaches the power: grow by half until one does, then bisect (in whole
    # rounds). Power grows with the budget; the common random numbers keep the steps in order.
    low, high = start - seeds_per_round, start
    while not reaches(high):
        if high >= SEEDS_LIMIT:
            raise PlanningError(f"a sequential plan needs more than {SEEDS_LIMIT} seeds for effect {effect:g} at sd {sd:g}")
        low, high = high, min(SEEDS_LIMIT, high + max(seeds_per_round, (high // 2) // seeds_per_round * seeds_per_round))
    while high - low > seeds_per_round:
        middle = low + (high - low) // (2 * seeds_per_round) * seeds_per_round
        low, high = (low, middle) if reaches(middle) else (middle, high)
    plan = replace(base, max_seeds=high)
    at_effect = results[high]
    null = simulate_plan(plan, sd=sd, true_difference=0.0, sesoi=sesoi, experiments=experiments)
    return SeedPlan(fixed, at_effect.expected_seeds, high, plan, at_effect.different, at_effect, null, sesoi)


def seeds_needed(
    sd_of_differences: float,
    effect: float,
    alpha: float = 0.05,
    power: float = 0.8,
    **plan_kwargs,
) -> SeedsNeeded:
    """``(fixed-design seeds, expected seeds of the sequential plan at the effect, its budget)``;
    ``plan_kwargs``: ``seeds_per_round``, ``spending``, ``comparisons``, ``min_seeds``, ``sesoi``
    (see :func:`plan_seeds`)."""
    found = plan_seeds(sd_of_differences, effect, alpha, power, **plan_kwargs)
    return SeedsNeeded(found.fixed, found.expected, found.max)
