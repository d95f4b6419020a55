"""Group-sequential boundaries from an alpha-spending function, computed exactly.

A comparison looked at K times can be declared different at any look, so each look must spend
only part of the error rate α. Lan & DeMets ("Discrete sequential boundaries for clinical
trials", Biometrika 70(3), 1983) fix how much: a spending function α(t) of the information
fraction t ∈ (0, 1], increasing from α(0) = 0 to α(1) = α. At the looks t_1 < … < t_K the
two-sided boundaries z_1, …, z_K solve, for the standardised statistics Z_j of a Brownian
motion (``Corr(Z_i, Z_j) = √(t_i / t_j)``, i ≤ j),

    P(|Z_1| < z_1, …, |Z_{j−1}| < z_{j−1}, |Z_j| ≥ z_j) = α(t_j) − α(t_{j−1})   (α(t_0) = 0).

Two spending functions, both from Lan & DeMets (1983):

- ``obrien_fleming``: ``α(t) = 2 − 2Φ(z_{1−α/2} / √t)``: almost nothing early, nearly the whole
  α at the last look (boundaries like O'Brien & Fleming's, 1979);
- ``pocock``: ``α(t) = α · ln(1 + (e − 1) t)``: spread nearly evenly (boundaries like Pocock's,
  1977, almost flat).

The probabilities are computed by recursive numerical integration over the score scale
``S_j = Z_j √t_j`` (independent normal increments of variance t_j − t_{j−1}), Simpson's rule
on a grid finer than a tenth of the smallest increment's standard deviation, as in Jennison &
Turnbull, *Group Sequential Methods with Applications to Clinical Trials* (2000), ch. 19. It
is deterministic (no Monte Carlo) and cached; :func:`crossing_probabilities` gives the same
integral for any boundaries, which the tests check against published constants.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np
from scipy import optimize
from scipy.special import ndtr, ndtri
from scipy.stats import t as scipy_t

SPENDING_FUNCTIONS = ("obrien_fleming", "pocock")

# Simpson grid on the continuation region: at least this many intervals, and spacing at most
# this share of the smallest increment's standard deviation (the Gaussian kernel must be resolved).
_MIN_INTERVALS = 400
_SPACING_PER_SD = 0.1


def spending_function(name: str, alpha: float) -> Callable[[float], float]:
    """``α(t)``, the two-sided error spent up to information fraction ``t`` (Lan & DeMets 1983)."""
    if name == "obrien_fleming":
        z = float(ndtri(1 - alpha / 2))
        return lambda t: 0.0 if t <= 0 else float(2 * ndtr(-z / math.sqrt(min(t, 1.0))))
    if name == "pocock":
        return lambda t: 0.0 if t <= 0 else alpha * math.log(1 + (math.e - 1) * min(t, 1.0))
    raise ValueError(f"spending {name!r} is not known; choose one of {', '.join(SPENDING_FUNCTIONS)}")


def _simpson_grid(half_width: float, smallest_sd: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and Simpson weights on ``[−half_width, half_width]`` (an even number of intervals)."""
    intervals = max(_MIN_INTERVALS, math.ceil(2 * half_width / (_SPACING_PER_SD * smallest_sd)))
    intervals += intervals % 2
    nodes = np.linspace(-half_width, half_width, intervals + 1)
    weights = np.ones(intervals + 1)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return nodes, weights * (nodes[1] - nodes[0]) / 3


def _exit_probability(mass: np.ndarray, nodes: np.ndarray, bound: float, sd: float) -> float:
    """P(continued so far and |S_next| ≥ bound): ``mass`` is the sub-density times the Simpson
    weights at ``nodes``, the increment is N(0, sd²). Each tail by ``ndtr`` of a negative
    argument, so tiny probabilities (early O'Brien–Fleming looks) keep their relative precision."""
    tails = ndtr((-bound - nodes) / sd) + ndtr((nodes - bound) / sd)
    return float(mass @ tails)


def _next_density(mass: np.ndarray, nodes: np.ndarray, new_nodes: np.ndarray, sd: float) -> np.ndarray:
    """The sub-density of S at the next look on ``new_nodes``: the continued mass convolved with
    the N(0, sd²) increment."""
    gaussian = np.exp(-0.5 * ((new_nodes[:, None] - nodes[None, :]) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
    return gaussian @ mass


def _check_fractions(fractions: Sequence[float]) -> np.ndarray:
    t = np.asarray(fractions, dtype=np.float64)
    if len(t) == 0 or np.any(t <= 0) or np.any(t > 1) or np.any(np.diff(t) <= 0):
        raise ValueError(f"information fractions must increase within (0, 1]; got {list(fractions)}")
    return t


def crossing_probabilities(boundaries: Sequence[float], fractions: Sequence[float]) -> list[float]:
    """Under no effect, the probability of first crossing ``|Z_j| ≥ boundaries[j]`` at each look
    ``j`` (their sum is the test's error rate). Same integration as :func:`spending_boundaries`."""
    t = _check_fractions(fractions)
    z = np.asarray(boundaries, dtype=np.float64)
    sds = np.sqrt(np.diff(np.concatenate([[0.0], t])))
    out = [float(2 * ndtr(-z[0]))]
    nodes, weights = _simpson_grid(z[0] * math.sqrt(t[0]), sds[1:].min() if len(t) > 1 else 1.0)
    mass = weights * np.exp(-0.5 * nodes**2 / t[0]) / math.sqrt(2 * math.pi * t[0])
    for j in range(1, len(t)):
        bound = z[j] * math.sqrt(t[j])
        out.append(_exit_probability(mass, nodes, bound, sds[j]))
        new_nodes, new_weights = _simpson_grid(bound, sds[j + 1 :].min() if j + 1 < len(t) else 1.0)
        mass = new_weights * _next_density(mass, nodes, new_nodes, sds[j])
        nodes = new_nodes
    return out


@lru_cache(maxsize=256)
def spending_boundaries(fractions: tuple[float, ...], alpha: float, spending: str) -> tuple[float, ...]:
    """Two-sided z boundaries at information ``fractions`` spending ``alpha`` by ``spending``
    (see the module doc). The last fraction need not be 1 (a plan stopped early spends less)."""
    t = _check_fractions(fractions)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1); got {alpha}")
    spend = spending_function(spending, alpha)
    spent = [spend(float(x)) for x in t]
    increments = np.diff(np.concatenate([[0.0], spent]))
    sds = np.sqrt(np.diff(np.concatenate([[0.0], t])))
    z = [float(-ndtri(increments[0] / 2))]
    nodes, weights = _simpson_grid(z[0] * math.sqrt(t[0]), sds[1:].min() if len(t) > 1 else 1.0)
    mass = weights * np.exp(-0.5 * nodes**2 / t[0]) / math.sqrt(2 * math.pi * t[0])
    for j in range(1, len(t)):

        def excess(bound: float, j: int = j, mass: np.ndarray = mass, nodes: np.ndarray = nodes) -> float:
            return _exit_probability(mass, nodes, bound, sds[j]) - increments[j]

        # The exit probability falls from P(continued) at bound 0 to 0; the root is between.
        high = math.sqrt(t[j]) * 2.0
        while excess(high) > 0:
            high *= 2
        bound = optimize.brentq(excess, 0.0, high, xtol=1e-12, rtol=1e-12)
        z.append(bound / math.sqrt(t[j]))
        new_nodes, new_weights = _simpson_grid(bound, sds[j + 1 :].min() if j + 1 < len(t) else 1.0)
        mass = new_weights * _next_density(mass, nodes, new_nodes, sds[j])
        nodes = new_nodes
    return tuple(z)


# Simulated t boundaries (see t_spending_boundaries): paths, the random seed, and the fewest
# paths a look's spent share must stand for before its quantile is read off the simulation.
T_PATHS = 200_000
T_SEED = 20_231_989  # any fixed number: the boundaries must not change between runs
_FEWEST_PATHS = 200


def nominal_t_boundaries(looks: Sequence[int], max_seeds: int, alpha: float, spending: str) -> tuple[float, ...]:
    """The significance-level conversion: each look's normal boundary ``z_j`` becomes the
    Student-t quantile with ``n_j − 1`` degrees of freedom at the same two-sided tail level."""
    z = spending_boundaries(tuple(n / max_seeds for n in looks), alpha, spending)
    return tuple(float(scipy_t.isf(ndtr(-zj), n - 1)) for zj, n in zip(z, looks))


@lru_cache(maxsize=64)
def t_spending_boundaries(
    looks: tuple[int, ...], max_seeds: int, alpha: float, spending: str, paths: int = T_PATHS
) -> tuple[float, ...]:
    """Spending boundaries for the t statistics themselves: ``c_j`` with
    ``P(|T_1| < c_1, …, |T_{j−1}| < c_{j−1}, |T_j| ≥ c_j) = α(t_j) − α(t_{j−1})`` for
    ``T_j = mean_j / (s_j / √n_j)`` of iid normal per-seed values with mean 0.

    That law does not depend on the unknown standard deviation (T is scale-free), so one
    simulation serves every experiment: ``paths`` simulated seed sequences with a fixed random
    seed (deterministic, cached). The first look is exact (``T_1`` is Student t with
    ``n_1 − 1`` degrees of freedom); a later look whose spent share is too small for the
    simulation to resolve (fewer than 200 paths) takes the significance-level conversion
    (:func:`nominal_t_boundaries`), which errs by a fraction of that tiny share."""
    if len(looks) == 0 or looks[0] < 2 or looks[-1] > max_seeds or any(b <= a for a, b in zip(looks, looks[1:])):
        raise ValueError(f"looks must increase from at least 2 seeds to at most max_seeds = {max_seeds}; got {looks}")
    spend = spending_function(spending, alpha)
    increments = np.diff(np.concatenate([[0.0], [spend(n / max_seeds) for n in looks]]))
    fallback = nominal_t_boundaries(looks, max_seeds, alpha, spending)
    rng = np.random.default_rng(T_SEED)
    total = np.zeros(paths)
    squares = np.zeros(paths)
    alive = np.ones(paths, dtype=bool)
    seen = 0
    out: list[float] = []
    for j, n in enumerate(looks):
        new = rng.standard_normal((paths, n - seen), dtype=np.float64)
        total += new.sum(axis=1)
        squares += (new * new).sum(axis=1)
        seen = n
        if j == 0:
            out.append(float(scipy_t.isf(increments[0] / 2, n - 1)))
        elif increments[j] * paths < _FEWEST_PATHS:
            out.append(fallback[j])
        else:
            variance = np.maximum(squares[alive] - total[alive] ** 2 / n, 0.0) / (n - 1)
            statistic = np.abs(total[alive] / n) / np.sqrt(variance / n)
            crossing = int(round(increments[j] * paths))  # paths that must cross here
            above = np.partition(statistic, len(statistic) - crossing - 1)[len(statistic) - crossing - 1 :]
            out.append(float((above[0] + above[1:].min()) / 2))  # between the last one kept and the first one crossing
        variance = np.maximum(squares - total**2 / n, 0.0) / (n - 1)
        alive &= np.abs(total / n) / np.sqrt(variance / n) < out[-1]
    return tuple(out)
