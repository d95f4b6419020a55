"""A/A calibration: how often ``compare``'s verdicts call two runs of the *same* recipe different.

An A/A pair is one arm run under two seed streams. Given the finished seed runs of one arm
(every seed of it, from any experiment), the seeds are split into two sides of ``k`` seeds
each — side A and side A′ — paired by position, and the comparison ``compare`` would make at
``k`` seeds is made: the paired Student-t interval of the per-seed differences (95%, the
report's fixed-sample verdict), and the sequential rule of ``until_resolved`` over the pairs
in order. Both sides are the same recipe, so every "different" is a false positive; the share
of splits declared different estimates the false-positive rate at ``k`` seeds *on this task,
this model and this machine*, where the intervals' assumptions (normal per-seed differences,
seeds as independent replications) are put to the test rather than assumed.

What the number is and is not: with ``n`` seed runs there are many splits but only
``⌊n / 2k⌋`` disjoint ones; splits share seeds, so they are not independent trials and the
rate's own uncertainty is wider than a binomial interval over the splits. The report gives the
rate, the number of splits and the number of disjoint splits, and a Wilson interval over the
*disjoint* count as the honest (wide) one.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from polyrl.analysis.sequential import SequentialPlan, history
from polyrl.analysis.stats import arm_difference
from polyrl.core.errors import PolyrlError

__all__ = ["AACalibration", "CalibrationError", "aa_calibration", "aa_splits", "wilson_interval"]


class CalibrationError(PolyrlError, ValueError):
    pass


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval for a binomial proportion (Wilson, JASA 22, 1927)."""
    if trials == 0:
        return (math.nan, math.nan)
    from scipy.stats import norm

    z = float(norm.ppf(1 - (1 - confidence) / 2))
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return (max(0.0, centre - half), min(1.0, centre + half))


def aa_splits(
    seeds: Sequence[int], per_side: int, *, max_splits: int = 2000, rng_seed: int = 0
) -> list[tuple[list[int], list[int]]]:
    """Splits of ``seeds`` into two sides of ``per_side`` seeds each (side A, side A′), paired by
    position. Every split when there are at most ``max_splits`` of them (unordered: A/A′ and
    A′/A are one split), else ``max_splits`` drawn at random with a fixed seed."""
    seeds = sorted(seeds)
    if per_side < 2:
        raise CalibrationError(f"--per-side {per_side}: a paired interval needs at least 2 seeds a side")
    if len(seeds) < 2 * per_side:
        raise CalibrationError(
            f"{len(seeds)} finished seed runs cannot make two sides of {per_side} (needs {2 * per_side}); "
            "run more seeds of the arm or lower --per-side"
        )
    chosen_sets = math.comb(len(seeds), 2 * per_side)
    halves = math.comb(2 * per_side, per_side) // 2
    if chosen_sets * halves <= max_splits:
        out = []
        for chosen in itertools.combinations(seeds, 2 * per_side):
            first = chosen[0]
            for side_a in itertools.combinations(chosen, per_side):
                if first not in side_a:
                    continue  # each unordered split once: side A holds the smallest seed
                side_b = [s for s in chosen if s not in side_a]
                out.append((list(side_a), side_b))
        return out
    rng = np.random.default_rng(rng_seed)
    out = []
    for _ in range(max_splits):
        drawn = [int(s) for s in rng.permutation(seeds)[: 2 * per_side]]
        out.append((sorted(drawn[:per_side]), sorted(drawn[per_side:])))
    return out


@dataclass(frozen=True)
class AACalibration:
    """The false "different" verdicts over the A/A splits of one arm's seed runs."""

    metric: str
    seeds: int  # finished seed runs of the arm with the metric
    per_side: int
    splits: int
    fixed_false: int  # splits whose paired 95% interval excluded 0
    sequential_false: int  # splits the sequential rule declared different at some look
    disjoint: int

    @property
    def fixed_rate(self) -> float:
        return self.fixed_false / self.splits

    @property
    def sequential_rate(self) -> float:
        return self.sequential_false / self.splits

    def describe(self) -> str:
        low, high = wilson_interval(round(self.fixed_rate * self.disjoint), self.disjoint)
        return (
            f"{self.metric}: A/A at {self.per_side} seeds a side ({self.seeds} seed runs, {self.splits} splits, "
            f"{self.disjoint} disjoint): the paired 95% interval called the two sides different in "
            f"{self.fixed_false} of {self.splits} ({self.fixed_rate:.1%}; nominal 5%; Wilson 95% over the disjoint "
            f"splits [{low:.0%}, {high:.0%}]); the sequential rule in {self.sequential_false} ({self.sequential_rate:.1%})"
        )


def aa_calibration(
    finals: dict[int, float], metric: str, per_side: int, *, sesoi: float = 1.0, alpha: float = 0.05, max_splits: int = 2000
) -> AACalibration:
    """The A/A false-positive counts for one metric from one arm's per-seed finals (seed → value).

    The sequential rule runs with a budget of ``per_side`` seeds a side in rounds of one, so it
    looks at 2, 3, …, ``per_side`` pairs; ``sesoi`` only decides "equivalent", which is not an
    error in an A/A pair."""
    values = {seed: value for seed, value in finals.items() if math.isfinite(value)}
    splits = aa_splits(list(values), per_side, max_splits=max_splits)
    plan = SequentialPlan(max_seeds=per_side, alpha=alpha)
    fixed_false = sequential_false = 0
    for side_a, side_b in splits:
        a = {i: values[s] for i, s in enumerate(side_a)}
        b = {i: values[s] for i, s in enumerate(side_b)}
        difference = arm_difference(a, b)
        interval = difference.interval
        if interval.low > 0 or interval.high < 0:
            fixed_false += 1
        looks = history([a[i] - b[i] for i in range(per_side)], plan, sesoi)
        if looks and looks[-1].verdict == "different":
            sequential_false += 1
    return AACalibration(
        metric=metric,
        seeds=len(values),
        per_side=per_side,
        splits=len(splits),
        fixed_false=fixed_false,
        sequential_false=sequential_false,
        disjoint=len(values) // (2 * per_side),
    )


def arm_seed_finals(
    experiment: str, *, tracking_uri: str, arm: str, metrics: list[str] | None = None
) -> dict[str, dict[int, float]]:
    """metric → seed → the last logged value, over the finished seed runs of ``arm`` in the newest
    run of ``experiment`` (as ``compare`` counts them). Without ``metrics``: the eval headline
    metrics the runs logged."""
    from polyrl.analysis.experiment_runs import (
        experiment_arm_run_ids,
        finished_seed_runs,
        require_existing_store,
        seed_finals,
        seed_runs_of,
    )
    from polyrl.analysis.report_metrics import eval_headline_keys, logged_metric_keys
    from polyrl.tracking.mlflow_runs import make_client

    require_existing_store(tracking_uri)
    client = make_client(tracking_uri)
    parent, arm_runs = experiment_arm_run_ids(client, experiment, tracking_uri)
    if arm not in arm_runs:
        raise CalibrationError(f"--arm {arm!r} is not an arm of experiment {experiment!r}; its arms: {', '.join(arm_runs)}")
    _, seed_runs = seed_runs_of(client, parent, {arm: arm_runs[arm]})
    if not seed_runs:
        raise CalibrationError(f"experiment {experiment!r} has no seed runs of arm {arm!r}: A/A needs an arm run with seeds")
    kept, _ = finished_seed_runs(client, seed_runs)
    logged = logged_metric_keys(client, list(kept[arm].values()))
    if metrics is None:
        metrics = eval_headline_keys(logged)
    unknown = [m for m in metrics if m not in logged]
    if unknown:
        raise CalibrationError(
            f"--metric {', '.join(unknown)}: not logged by the seed runs of {arm!r}; logged: {', '.join(sorted(logged))}"
        )
    return {metric: by_arm[arm] for metric, by_arm in seed_finals(client, kept, metrics).items()}
