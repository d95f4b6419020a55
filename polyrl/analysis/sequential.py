"""Seeds added until a comparison is settled: repeated confidence intervals over rounds of seeds.

An experiment runs its arms over seeds in rounds and, after each round, decides for each
comparison of two arms (the per-seed paired differences of a final metric, arm a − arm b):

- ``different``: the repeated confidence interval (RCI) of the mean difference excludes 0;
- ``equivalent``: the RCI lies inside ``(−δ, +δ)``, δ the smallest effect of interest (SESOI);
- ``undecided``: neither; add a round of seeds. At the planned last look (the seed budget) a
  comparison still undecided is reported as undecided at budget, with its interval.

Looking after every round and stopping when something shows would inflate the error rate of
fixed-sample intervals (every look is a new chance of a false "different"). Repeated
confidence intervals keep it: Jennison & Turnbull, "Interim analyses: the repeated confidence
interval approach" (JRSS-B 51(3), 1989; and *Group Sequential Methods with Applications to
Clinical Trials*, 2000, ch. 9) build, at look j with n_j seeds,

    mean ± c_j · s / √n_j,

where the critical values c_1, …, c_K come from a group-sequential test, so that all K
intervals cover the true mean difference together with probability at least 1 − α, whatever
rule chose when to stop. A wrong verdict needs an interval that misses the truth: "different"
when there is no difference, or "equivalent" when the difference is δ or more (then at most
α/2, one side). Stopping at the first decided look is therefore safe.

The boundaries are Lan & DeMets's ("Discrete sequential boundaries for clinical trials",
Biometrika 70(3), 1983) spending-function ones (:mod:`polyrl.analysis.sequential_boundaries`):
O'Brien–Fleming-type spending by default (very wide early, close to the fixed-sample interval
at the budget), Pocock-type optionally (about equally wide at every look). The maximum number
of looks is fixed in advance by the seed budget: rounds of ``seeds_per_round`` seeds up to
``max_seeds``; the information fraction at look j is ``n_j / max_seeds``. A look needs two
seeds for a standard deviation, so looks below ``min_seeds`` (≥ 2) are skipped; the spending
function is evaluated only at looks that happen, with the planned maximum fixed, so the first
look spends ``α(n_1 / max_seeds)``, the share that a skipped look would have spent included.

The per-seed standard deviation is unknown and seeds are few, so the intervals use Student t
critical values ``c_j`` instead of the normal ``z_j``; ``t_boundaries`` says how they are found:

- ``nominal_level`` (the significance-level approach, Jennison & Turnbull 2000, ch. 3 on
  normal data with unknown variance): each look's nominal two-sided tail level
  ``p_j = 2(1 − Φ(z_j))`` becomes ``c_j = t_{n_j − 1}^{-1}(1 − p_j / 2)``. An approximation:
  the t statistics at successive looks share their variance estimates, so their joint law is
  not the normal one the ``z_j`` were computed for. With 2–20 seeds it spends more than planned
  at each look after the first (docs/verdicts.md measures how much), so it is not the default.
- ``simulated`` (default): the same Lan–DeMets spending applied to the t statistics directly,
  each ``c_j`` chosen so that look j spends exactly ``α(t_j) − α(t_{j−1})`` of the t process,
  read off 200,000 simulated seed sequences with a fixed random seed
  (:func:`~polyrl.analysis.sequential_boundaries.t_spending_boundaries`; the t process does not
  depend on the unknown standard deviation, so one simulation serves every experiment; the
  first look is exact). Exact calculations are possible too (Jennison & Turnbull, "Exact
  calculations for sequential t, χ² and F tests", Biometrika 78(1), 1991) but are not needed at
  this precision. Both assume normal per-seed differences; the tests also measure a skewed,
  bounded case (accuracies from binomial draws).

Several comparisons (arms × metrics) split α by Bonferroni: each gets ``α / comparisons``.
Holm's step-down (used by the fixed-sample report, :mod:`polyrl.analysis.stats`) cannot be
applied across sequential looks simply: it passes the α of a rejected hypothesis on to the
others, but here each comparison's boundaries are fixed in advance from its own spending
schedule and comparisons settle at different looks; recycling α there needs the graphical
group-sequential procedures of Maurer & Bretz ("Multiple testing in group sequential trials
using graphical approaches", Statistics in Biopharmaceutical Research 5(4), 2013).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.special import ndtr

from polyrl.analysis.sequential_boundaries import (
    SPENDING_FUNCTIONS,
    nominal_t_boundaries,
    spending_boundaries,
    t_spending_boundaries,
)
from polyrl.core.errors import PolyrlError

VERDICTS = ("undecided", "different", "equivalent")  # the codes of sequential_outcomes, in this order
T_BOUNDARIES = ("simulated", "nominal_level")
_TIES = 1e-9  # a standard deviation below this share of the largest |difference| is float rounding of equal values


class SequentialPlanError(PolyrlError, ValueError):
    """A sequential plan or its inputs that cannot be used (the message names the field)."""


@dataclass(frozen=True)
class SequentialPlan:
    """The seed budget and error rate of a sequential comparison, fixed before the first seed.

    ``max_seeds`` seeds per arm at most, run in rounds of ``seeds_per_round``; a look after each
    round with at least ``min_seeds`` seeds (the last round may be shorter, to end at
    ``max_seeds``). ``alpha`` is the family-wise error rate over all ``comparisons`` (Bonferroni:
    each gets ``alpha / comparisons``); ``spending`` is ``obrien_fleming`` or ``pocock``."""

    max_seeds: int
    seeds_per_round: int = 1
    alpha: float = 0.05
    spending: str = "obrien_fleming"
    comparisons: int = 1
    min_seeds: int = 2
    t_boundaries: str = "simulated"

    def __post_init__(self) -> None:
        def need(ok: bool, field: str, allowed: str) -> None:
            if not ok:
                raise SequentialPlanError(f"SequentialPlan.{field} = {getattr(self, field)!r}: must be {allowed}")

        need(isinstance(self.min_seeds, int) and self.min_seeds >= 2, "min_seeds", "an integer ≥ 2 (a look needs a std)")
        need(
            isinstance(self.max_seeds, int) and self.max_seeds >= self.min_seeds,
            "max_seeds",
            f"an integer ≥ min_seeds ({self.min_seeds})",
        )
        need(isinstance(self.seeds_per_round, int) and self.seeds_per_round >= 1, "seeds_per_round", "an integer ≥ 1")
        need(0 < self.alpha < 1, "alpha", "in (0, 1)")
        need(self.spending in SPENDING_FUNCTIONS, "spending", f"one of {', '.join(SPENDING_FUNCTIONS)}")
        need(isinstance(self.comparisons, int) and self.comparisons >= 1, "comparisons", "an integer ≥ 1")
        need(self.t_boundaries in T_BOUNDARIES, "t_boundaries", f"one of {', '.join(T_BOUNDARIES)}")

    @property
    def alpha_per_comparison(self) -> float:
        return self.alpha / self.comparisons

    def looks(self) -> list[int]:
        """The seed counts at which the comparison is looked at, in order (the last is ``max_seeds``)."""
        rounds = list(range(self.seeds_per_round, self.max_seeds, self.seeds_per_round)) + [self.max_seeds]
        return [n for n in rounds if n >= self.min_seeds]

    def _look_index(self, n_seeds: int) -> int:
        looks = self.looks()
        if n_seeds not in looks:
            raise SequentialPlanError(
                f"{n_seeds} seeds is not a look of this plan (looks at {', '.join(map(str, looks))} seeds: rounds of "
                f"{self.seeds_per_round} up to max_seeds = {self.max_seeds}, from min_seeds = {self.min_seeds})"
            )
        return looks.index(n_seeds)

    def z_boundaries(self) -> tuple[float, ...]:
        """The normal-theory two-sided boundaries at :meth:`looks` (cached by the boundaries module)."""
        fractions = tuple(n / self.max_seeds for n in self.looks())
        return spending_boundaries(fractions, self.alpha_per_comparison, self.spending)

    def nominal_level(self, n_seeds: int) -> float:
        """The two-sided tail level this look's boundary leaves: ``2(1 − Φ(z_j))``."""
        return float(2 * ndtr(-self.z_boundaries()[self._look_index(n_seeds)]))

    def critical_values(self) -> list[float]:
        """The Student-t critical value at each of :meth:`looks` (see ``t_boundaries`` in the module doc)."""
        looks = tuple(self.looks())
        if self.t_boundaries == "nominal_level":
            return list(nominal_t_boundaries(looks, self.max_seeds, self.alpha_per_comparison, self.spending))
        return list(t_spending_boundaries(looks, self.max_seeds, self.alpha_per_comparison, self.spending))

    def boundary(self, n_seeds: int) -> float:
        """The Student-t critical value ``c_j`` at the look with ``n_seeds`` seeds."""
        return self.critical_values()[self._look_index(n_seeds)]


@dataclass(frozen=True)
class SequentialDecision:
    """The verdict at one look: the mean of the ``n`` paired differences and its repeated CI
    ``[low, high] = mean ± critical · s/√n`` (NaN when every difference is the same: no spread,
    no interval, undecided); ``final`` when ``n`` is the budget."""

    n: int
    mean: float
    low: float
    high: float
    critical: float
    verdict: str  # "different" | "equivalent" | "undecided"
    final: bool
    sesoi: float
    max_seeds: int
    confidence: float  # simultaneous coverage over all looks of this comparison: 1 − alpha / comparisons

    def describe(self, metric: str, arm_a: str, arm_b: str, higher_is_better: bool = True) -> str:
        """One sentence; ``higher_is_better`` only decides which arm the sentence calls better."""
        interval = (
            f"{arm_a} − {arm_b} = {self.mean:.3g}, {self.confidence:.1%} repeated CI [{self.low:.3g}, {self.high:.3g}]"
        ).replace(".0%", "%")
        at = f"at {self.n} of {self.max_seeds} seeds"
        band = f"±{self.sesoi:.3g}"
        if math.isnan(self.low):
            state = f"undecided at the budget of {self.max_seeds} seeds" if self.final else f"undecided {at}; add seeds"
            return (
                f"{metric}: {arm_a} vs {arm_b} {state} (every seed's {arm_a} − {arm_b} is {self.mean:.3g}: "
                "with no spread between seeds there is no t interval)."
            )
        if self.verdict == "different":
            a_better = (self.mean > 0) == higher_is_better
            better, worse = (arm_a, arm_b) if a_better else (arm_b, arm_a)
            small = f"; the difference is smaller than the smallest effect of interest {band}" if self._inside() else ""
            return f"{metric}: {better} is better than {worse} ({interval} excludes 0) {at}{small}."
        if self.verdict == "equivalent":
            return f"{metric}: {arm_a} and {arm_b} are equivalent within {band} ({interval} lies inside {band}) {at}."
        state = f"undecided at the budget of {self.max_seeds} seeds" if self.final else f"undecided {at}; add seeds"
        return f"{metric}: {arm_a} vs {arm_b} {state} ({interval} contains 0 and reaches beyond {band})."

    def _inside(self) -> bool:
        return -self.sesoi < self.low and self.high < self.sesoi


def _check_sesoi(sesoi: float) -> None:
    if not (isinstance(sesoi, (int, float)) and math.isfinite(sesoi) and sesoi > 0):
        raise SequentialPlanError(f"sesoi = {sesoi!r}: the smallest effect of interest must be a finite number > 0")


def _verdict_codes(low: np.ndarray, high: np.ndarray, sesoi: float) -> np.ndarray:
    """0 undecided, 1 different (the interval excludes 0; wins over equivalent when both hold),
    2 equivalent (inside (−δ, δ)). A NaN interval (no spread between seeds) decides nothing."""
    different = (low > 0) | (high < 0)
    equivalent = (low > -sesoi) & (high < sesoi)
    return np.where(different, 1, np.where(equivalent, 2, 0)).astype(np.int8)


def _repeated_interval(values: np.ndarray, critical: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, low, high)`` over the last axis, ``mean ± critical · s/√n``; the bounds are NaN
    where the seeds' differences are all equal: a t interval needs spread, and a discrete metric
    (accuracy on 200 prompts) makes two seeds tie often enough for zero-width intervals to call
    a false "different" (docs/verdicts.md). Equal up to float rounding counts as equal
    (0.3 − 0.285 and 0.5 − 0.485 differ in the 17th digit)."""
    n = values.shape[-1]
    mean = values.mean(axis=-1)
    sd = values.std(axis=-1, ddof=1)
    spread = sd > _TIES * np.abs(values).max(axis=-1)
    half = np.where(spread, critical * sd / math.sqrt(n), np.nan)
    return mean, mean - half, mean + half


def decide(differences: Sequence[float], plan: SequentialPlan, sesoi: float) -> SequentialDecision:
    """The verdict at the look with ``len(differences)`` seeds (the per-seed paired differences
    so far, in seed order; that count must be one of ``plan.looks()``)."""
    _check_sesoi(sesoi)
    values = np.asarray(differences, dtype=np.float64)
    if values.ndim != 1 or not np.all(np.isfinite(values)):
        raise SequentialPlanError("differences: one finite number per seed (a missing or non-finite seed would shift the looks)")
    n = len(values)
    critical = plan.boundary(n)
    mean_, low_, high_ = _repeated_interval(values, critical)
    mean, low, high = float(mean_), float(low_), float(high_)
    code = int(_verdict_codes(low_, high_, sesoi))
    return SequentialDecision(
        n=n,
        mean=mean,
        low=low,
        high=high,
        critical=critical,
        verdict=VERDICTS[code],
        final=n == plan.max_seeds,
        sesoi=float(sesoi),
        max_seeds=plan.max_seeds,
        confidence=1 - plan.alpha_per_comparison,
    )


def history(differences: Sequence[float], plan: SequentialPlan, sesoi: float) -> list[SequentialDecision]:
    """The decision at each look the ``differences`` reach, in order, ending at the first look
    that decided (``different`` or ``equivalent``): later seeds do not change a settled verdict.
    So the last entry is the current verdict: decided, or the latest undecided look (``final``
    when that is the budget). Empty before the first look."""
    out: list[SequentialDecision] = []
    for n in plan.looks():
        if n > len(differences):
            break
        out.append(decide(list(differences)[:n], plan, sesoi))
        if out[-1].verdict != "undecided":
            break
    return out


@dataclass(frozen=True)
class SimulatedOutcomes:
    """Per simulated experiment: the verdict code (index into :data:`VERDICTS`), the seeds used
    when it stopped, and the mean difference then."""

    verdict: np.ndarray
    seeds: np.ndarray
    mean: np.ndarray

    def share(self, verdict: str) -> float:
        return float(np.mean(self.verdict == VERDICTS.index(verdict)))


def sequential_outcomes(samples: np.ndarray, plan: SequentialPlan, sesoi: float) -> SimulatedOutcomes:
    """:func:`history` for many experiments at once: ``samples`` is (experiments × max_seeds),
    each row the per-seed differences one experiment would see; each stops at its first
    decided look. Same verdict rule as :func:`decide` (a test checks they agree)."""
    _check_sesoi(sesoi)
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < plan.max_seeds:
        raise SequentialPlanError(f"samples: (experiments × at least max_seeds = {plan.max_seeds}); got shape {x.shape}")
    experiments = x.shape[0]
    verdict = np.zeros(experiments, dtype=np.int8)
    seeds = np.full(experiments, plan.max_seeds)
    mean_at_stop = np.zeros(experiments)
    open_ = np.ones(experiments, dtype=bool)
    for n, critical in zip(plan.looks(), plan.critical_values()):
        rows = np.flatnonzero(open_)
        part = x[rows, :n]
        mean, low, high = _repeated_interval(part, critical)
        code = _verdict_codes(low, high, sesoi)
        verdict[rows] = code
        mean_at_stop[rows] = mean
        stopped = rows[code != 0]
        seeds[stopped] = n
        open_[stopped] = False
    return SimulatedOutcomes(verdict=verdict, seeds=seeds, mean=mean_at_stop)
