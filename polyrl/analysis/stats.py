"""Statistics for comparing arms over seeds: intervals, differences, interquartile means.

RL results move with the seed (Henderson et al. 2018, "Deep Reinforcement Learning that
Matters"; Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice" — rliable).
A comparison therefore reports, per arm, the mean over seeds with a 95% confidence interval
and the interquartile mean (IQM), and for each pair of arms the difference of means with its
interval, saying in words when that interval contains zero.

Arms that ran the same seeds are paired: at one seed they share the prompt order, the
sampler's request seeds and the warm start, so their first rollouts are identical and much of
the seed-to-seed variation is common to both. Their difference gets the interval of the mean
of the per-seed differences (Student t, n − 1 degrees of freedom); arms with other seeds get a
Welch interval (:func:`arm_difference` says which it used). A report makes many comparisons at
once (arms × metrics), so its verdicts use Holm's step-down adjustment of the p-values over all
of them (:func:`holm_adjusted`, Holm 1979), which keeps the chance of any false "X is higher"
at 5%; the intervals printed stay the unadjusted 95% ones.

Deviations from rliable: rliable bootstraps IQM over runs × tasks with stratified bootstrap;
here there is one task per comparison, so the mean gets a Student-t interval (exact for
normal seeds, honest at 3–5 seeds where a bootstrap under-covers) and the difference a paired
or Welch interval. :func:`bootstrap_interval` is offered for statistics without a closed form.
Everything is computed by numpy/scipy; nothing here hand-writes a distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """An estimate with its confidence interval; ``low``/``high`` are NaN when undefined
    (fewer than two values)."""

    estimate: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def format(self, digits: int = 3) -> str:
        if math.isnan(self.low):
            return f"{self.estimate:.{digits}g} (n={self.n})"
        return f"{self.estimate:.{digits}g} ± {self.half_width:.{digits}g}"


def _values(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    return array[np.isfinite(array)]


def mean_interval(values: Sequence[float], *, confidence: float = CONFIDENCE) -> Interval:
    """Mean with a Student-t interval: ``mean ± t_{n-1} · s/√n`` (s the sample std, ddof=1)."""
    array = _values(values)
    n = len(array)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(array.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n)
    sem = float(scipy_stats.sem(array))
    if sem == 0.0:
        return Interval(mean, mean, mean, n)
    low, high = scipy_stats.t.interval(confidence, n - 1, loc=mean, scale=sem)
    return Interval(mean, float(low), float(high), n)


def welch_difference(a: Sequence[float], b: Sequence[float], *, confidence: float = CONFIDENCE) -> Interval:
    """``mean(a) − mean(b)`` with a Welch interval (unequal variances, Welch–Satterthwaite df)."""
    x, y = _values(a), _values(b)
    if len(x) == 0 or len(y) == 0:
        return Interval(math.nan, math.nan, math.nan, min(len(x), len(y)))
    difference = float(x.mean() - y.mean())
    if len(x) < 2 or len(y) < 2:
        return Interval(difference, math.nan, math.nan, min(len(x), len(y)))
    if x.var(ddof=1) == 0.0 and y.var(ddof=1) == 0.0:
        return Interval(difference, difference, difference, min(len(x), len(y)))
    result = scipy_stats.ttest_ind(x, y, equal_var=False)
    low, high = result.confidence_interval(confidence_level=confidence)
    return Interval(difference, float(low), float(high), min(len(x), len(y)))


@dataclass(frozen=True)
class Difference:
    """``mean(a) − mean(b)`` with its interval, how it was computed (``"paired"`` over the
    seeds both arms ran, or ``"Welch"``) and the two-sided p-value of "no difference"."""

    interval: Interval
    method: str
    p_value: float


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], *, confidence: float = CONFIDENCE) -> Interval:
    """The mean of the per-seed differences ``a[s] − b[s]`` over the seeds both have (finite in
    both), with a Student-t interval on n − 1 degrees of freedom."""
    seeds = sorted(seed for seed in set(a) & set(b) if math.isfinite(a[seed]) and math.isfinite(b[seed]))
    return mean_interval([a[seed] - b[seed] for seed in seeds], confidence=confidence)


def _p_value(statistic_test: Callable[[], object], low: float, high: float, estimate: float) -> float:
    if math.isnan(low):
        return math.nan
    if low == high:  # no spread at all: the difference is exactly what it is
        return 1.0 if estimate == 0.0 else 0.0
    return float(statistic_test().pvalue)


def arm_difference(a: Mapping[int, float], b: Mapping[int, float], *, confidence: float = CONFIDENCE) -> Difference:
    """Paired over seeds when both arms have the same seeds (at least two), Welch otherwise."""
    finite_a = {s: v for s, v in a.items() if math.isfinite(v)}
    finite_b = {s: v for s, v in b.items() if math.isfinite(v)}
    if set(finite_a) == set(finite_b) and len(finite_a) >= 2:
        interval = paired_difference(finite_a, finite_b, confidence=confidence)
        seeds = sorted(finite_a)
        differences = np.array([finite_a[s] - finite_b[s] for s in seeds])
        return Difference(
            interval,
            "paired",
            _p_value(lambda: scipy_stats.ttest_1samp(differences, 0.0), interval.low, interval.high, interval.estimate),
        )
    x, y = list(finite_a.values()), list(finite_b.values())
    interval = welch_difference(x, y, confidence=confidence)
    return Difference(
        interval,
        "Welch",
        _p_value(lambda: scipy_stats.ttest_ind(x, y, equal_var=False), interval.low, interval.high, interval.estimate),
    )


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control over all the comparisons):
    the i-th smallest of m p-values becomes ``max_{j ≤ i} min(1, (m − j + 1) · p_(j))``. NaN
    (no test possible) stays NaN and does not count in m."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m = len(indexed)
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[index] = running
    return adjusted


def interquartile_mean(values: Sequence[float]) -> float:
    """Mean of the middle 50% of the values (rliable's IQM): ``trim_mean(values, 0.25)``."""
    array = _values(values)
    return float(scipy_stats.trim_mean(array, 0.25)) if len(array) else math.nan


def bootstrap_interval(
    values: Sequence[float],
    statistic: Callable[[np.ndarray], float] = np.mean,
    *,
    confidence: float = CONFIDENCE,
    resamples: int = 2000,
    seed: int = 0,
) -> Interval:
    """Percentile-bootstrap interval of any statistic (scipy.stats.bootstrap)."""
    array = _values(values)
    if len(array) < 2:
        estimate = float(statistic(array)) if len(array) else math.nan
        return Interval(estimate, math.nan, math.nan, len(array))
    result = scipy_stats.bootstrap(
        (array,),
        statistic,
        confidence_level=confidence,
        n_resamples=resamples,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return Interval(
        float(statistic(array)), float(result.confidence_interval.low), float(result.confidence_interval.high), len(array)
    )


def verdict(difference: Interval, *, names: tuple[str, str], adjusted_p: float | None = None, comparisons: int = 1) -> str:
    """One sentence on whether ``names[0] − names[1]`` is distinguishable from noise. With
    ``adjusted_p`` (Holm over ``comparisons``), "higher" needs the adjusted p below 1 − confidence
    as well as an interval that excludes 0."""
    first, second = names
    if math.isnan(difference.low):
        return f"{first} vs {second}: too few seeds for an interval (n={difference.n})"
    if difference.contains(0.0):
        return f"{first} vs {second}: not distinguishable from noise at {difference.n} seeds (the interval contains 0)"
    better = first if difference.estimate > 0 else second
    if adjusted_p is not None and not adjusted_p < 1 - CONFIDENCE:
        return (
            f"{first} vs {second}: not distinguishable from noise after Holm's correction over {comparisons} comparisons "
            f"(adjusted p = {adjusted_p:.2g}; unadjusted, the {CONFIDENCE:.0%} interval excludes 0)"
        )
    held = f" and holds after Holm's correction over {comparisons} comparisons" if adjusted_p is not None else ""
    return f"{first} vs {second}: {better} is higher; the {CONFIDENCE:.0%} interval excludes 0 at {difference.n} seeds{held}"


def curve_band(
    histories: Sequence[Sequence[tuple[int, float]]], *, confidence: float = CONFIDENCE
) -> tuple[list[int], list[float], list[float], list[float]]:
    """Per-step mean and t-interval across seeds: ``(steps, mean, low, high)``.

    A step enters only where at least one seed logged it; where only one did, the band is
    the value itself (no spread to show).
    """
    by_step: dict[int, list[float]] = {}
    for history in histories:
        for step, value in history:
            by_step.setdefault(int(step), []).append(float(value))
    steps, means, lows, highs = [], [], [], []
    for step in sorted(by_step):
        interval = mean_interval(by_step[step], confidence=confidence)
        if math.isnan(interval.estimate):
            continue
        steps.append(step)
        means.append(interval.estimate)
        lows.append(interval.estimate if math.isnan(interval.low) else interval.low)
        highs.append(interval.estimate if math.isnan(interval.high) else interval.high)
    return steps, means, lows, highs
