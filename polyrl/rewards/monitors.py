"""Reward-hacking signals: pure functions over one step's samples or a run's per-step curves.

A policy that learns to please its reward rather than to do the task leaves traces that no
single reward curve shows: the training reward climbs while a held-out score does not, one
reward term starts to pay for what another term punishes, the reward can be predicted from the
completion's length alone, the completions collapse onto a few texts, or a learned judge parts
company with a rule that checks the same thing. ("Scaling Laws for Reward Model
Overoptimization", Gao, Schulman and Hilton, arXiv 2210.10760, §1 and §3: the proxy reward
keeps rising while the gold reward peaks and falls; "Defining and Characterizing Reward
Hacking", Skalse et al., arXiv 2209.13085.)

Each function takes plain lists (``None`` marks an unscored sample, which is left out) and
returns a figure, or ``None`` when the data cannot support one (fewer than three scored pairs,
a constant series). The health monitor (:mod:`polyrl.monitoring.reward_hacking`) keeps the history
and decides when a figure is a warning; the comparison report reads the warnings back.
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Sequence

import numpy as np

# Fewer pairs than this give a correlation that means nothing (two points always correlate ±1).
MIN_PAIRS = 3


def _pairs(x: Sequence[float | None], y: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    if len(x) != len(y):
        raise ValueError(f"two series of different lengths: {len(x)} and {len(y)}")
    kept = [(a, b) for a, b in zip(x, y) if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]
    if not kept:
        return np.zeros(0), np.zeros(0)
    arr = np.asarray(kept, dtype=np.float64)
    return arr[:, 0], arr[:, 1]


def pearson(x: Sequence[float | None], y: Sequence[float | None]) -> float | None:
    """Pearson's correlation over the pairs where both are scored; ``None`` with fewer than
    three pairs or when either side is constant (no variance: the correlation is undefined)."""
    a, b = _pairs(x, y)
    if len(a) < MIN_PAIRS:
        return None
    a, b = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    # Relative test: a series that differs only by float rounding counts as constant.
    if denominator <= 1e-12 * max(1.0, float(np.abs(a).max()) * float(np.abs(b).max()) * len(a)):
        return None
    return float((a * b).sum()) / denominator


def change_over(points: Sequence[tuple[int, float]], *, first_step: int, last_step: int) -> float | None:
    """The least-squares slope of ``(step, value)`` points with ``first_step <= step <= last_step``,
    times ``last_step - first_step``: how much the curve moved over the window, robust to one noisy
    step (a difference of end points is not). ``None`` with fewer than two points in the window."""
    kept = [(s, v) for s, v in points if first_step <= s <= last_step and v is not None and math.isfinite(v)]
    if len(kept) < 2 or len({s for s, _ in kept}) < 2:
        return None
    steps = np.asarray([s for s, _ in kept], dtype=np.float64)
    values = np.asarray([v for _, v in kept], dtype=np.float64)
    slope = float(np.polyfit(steps, values, 1)[0])
    return slope * (last_step - first_step)


def held_out_divergence(
    train: Sequence[tuple[int, float]],
    held_out: Sequence[tuple[int, float]],
    *,
    window: int,
    min_rise: float,
    stall: float,
) -> dict[str, float] | None:
    """The training reward rose by at least ``min_rise`` over the last ``window`` steps while the
    held-out score moved by at most ``stall`` (fell, or stayed flat) over the same steps.

    The window ends at the last held-out point (evaluations are sparser than steps) and starts
    ``window`` steps before it, or at the first held-out point if that is later; both changes are
    least-squares slopes times that span (:func:`change_over`). Returns the two
    changes when the pattern holds, ``None`` otherwise or when the window holds fewer than two
    held-out points.
    """
    if not held_out:
        return None
    last = max(s for s, _ in held_out)
    # The window starts no earlier than the first held-out point: before it there is nothing to
    # compare, and change_over multiplies its slope by the window, so an early window reaching back
    # past step 0 extrapolated (a rise of 2 between steps 1 and 2 was reported as +103 "over steps
    # 0-2" with a 50-step window).
    first = max(last - window, min(s for s, _ in held_out))
    held = change_over(held_out, first_step=first, last_step=last)
    rise = change_over(train, first_step=first, last_step=last)
    if held is None or rise is None:
        return None
    if rise >= min_rise and held <= stall:
        return {"train_change": rise, "held_out_change": held, "first_step": float(first), "last_step": float(last)}
    return None


def component_correlations(parts: dict[str, Sequence[float | None]]) -> dict[tuple[str, str], float]:
    """Pearson's correlation over the step's samples of every pair of reward components (labels in
    the given order); pairs without a defined correlation are left out."""
    out = {}
    for a, b in combinations(parts, 2):
        r = pearson(parts[a], parts[b])
        if r is not None:
            out[(a, b)] = r
    return out


def component_shares(parts: dict[str, Sequence[float | None]], weights: dict[str, float]) -> dict[str, float] | None:
    """Each component's share of the variance of the weighted total over the step's samples:
    ``cov(w_i c_i, T) / var(T)`` with ``T = Σ_j w_j c_j``. The shares sum to 1 (the covariance is
    linear in its first argument); one near 1 means that component alone decides which samples
    the advantage favours. A share can be negative (a component that pulls against the total).
    Samples where any component is unscored are left out, as the composite leaves their total
    out; ``None`` with fewer than three such samples, fewer than two components, or a constant total.
    """
    labels = list(parts)
    if len(labels) < 2:
        return None
    n = len(parts[labels[0]])
    rows = [
        [weights.get(label, 1.0) * float(parts[label][i]) for label in labels]
        for i in range(n)
        if all(parts[label][i] is not None and math.isfinite(parts[label][i]) for label in labels)
    ]
    if len(rows) < MIN_PAIRS:
        return None
    terms = np.asarray(rows, dtype=np.float64)
    total = terms.sum(axis=1)
    centred_total = total - total.mean()
    variance = float((centred_total**2).sum())
    if variance <= 1e-12 * max(1.0, float(np.abs(total).max()) ** 2 * len(total)):
        return None
    centred = terms - terms.mean(axis=0)
    return {label: float((centred[:, j] * centred_total).sum()) / variance for j, label in enumerate(labels)}


def distinct_per_prompt(prompts: Sequence[str], completions: Sequence[str]) -> float | None:
    """Distinct completion texts per distinct prompt in a batch: 1 or more while each prompt gets
    its own answer (up to the group size with diverse samples), below 1 when different prompts
    get the same text back, ``1 / #prompts`` when every completion is the same string.
    ``None`` for an empty batch. Texts are compared after stripping surrounding whitespace."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts and {len(completions)} completions")
    if not completions:
        return None
    return len({c.strip() for c in completions}) / len(set(prompts))
