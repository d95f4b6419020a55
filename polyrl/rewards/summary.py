"""Summary statistics the eval harness reports beside the reward modules' scores."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# The largest |score| a reward module may return, and a total may reach: float32's largest
# finite value, because the learner holds rewards as a float32 tensor (trainer/pipeline.py).
SCORE_LIMIT = float(np.finfo(np.float32).max)


def mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population (ddof=0) std of finite ``values``, never raising on their size.

    ``math.fsum`` raises OverflowError on an intermediate sum past the float range (1e308 + 1e308)
    and squaring a deviation of 1e160 does too; both are computed on the values divided by
    their largest magnitude (in [-1, 1]) and scaled back, so the result is inf only when the
    mean or std itself is past the float range. Values of ordinary size take the direct sums
    (bit for bit what they always gave).
    """
    if not values:
        return math.nan, math.nan
    try:
        mean = math.fsum(values) / len(values)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
        if math.isfinite(mean) and math.isfinite(std):
            return mean, std
    except OverflowError:
        pass
    scale = max(abs(float(v)) for v in values)
    if scale == 0 or not math.isfinite(scale):
        mean = math.fsum(values) / len(values) if math.isfinite(scale) else math.nan
        return mean, 0.0 if scale == 0 else math.nan
    unit = [float(v) / scale for v in values]
    unit_mean = math.fsum(unit) / len(unit)
    unit_std = math.sqrt(math.fsum((u - unit_mean) ** 2 for u in unit) / len(unit))
    return unit_mean * scale, unit_std * scale


def mean_of_scored(values: Sequence[float | None]) -> float:
    """Mean over the values that are not ``None``; NaN when none are."""
    scored = [float(v) for v in values if v is not None]
    return mean_and_std(scored)[0] if scored else float("nan")


def is_correct(value: float | None) -> bool:
    """A sample is correct when its accuracy score is > 0 (see :func:`accuracy_share`)."""
    return value is not None and value > 0


def accuracy_share(values: Sequence[float | None]) -> float:
    """polyrl's one definition of accuracy, used by ``train/accuracy`` and by the eval harness's
    ``accuracy``: the share of SCORED samples (value not ``None``) whose score from the accuracy
    reward is > 0. In training the accuracy reward is the one ``tracking.accuracy_reward``
    names (default: the reward labelled ``accuracy``); in an eval suite it is the suite's
    ``metrics.accuracy`` module. NaN when no sample is scored.

    "> 0" rather than "equals the module's ``correct`` value" so that any reward that scores a
    right answer positive and a wrong one 0 or below (a custom verifier, ``accuracy`` with
    ``correct: 2``) defines accuracy without extra configuration.
    """
    scored = [v for v in values if v is not None]
    return sum(is_correct(v) for v in scored) / len(scored) if scored else float("nan")


def length_stats(lengths: Sequence[int], truncated: Sequence[bool]) -> dict[str, float]:
    """``mean``, ``median``, ``p90`` (numpy's linear interpolation) and ``truncated_share``.

    Lengths are completion tokens. ``truncated_share`` is the share of samples that hit
    ``max_tokens`` (finish reason ``length``): a high share means the lengths (and any score
    read from the end of a completion) are cut off by the budget, not chosen by the model.
    """
    if not lengths:
        return {}
    values = np.asarray(lengths, dtype=np.float64)
    return {
        "mean": float(values.mean()),
        "median": float(np.median(values)),
        "p90": float(np.percentile(values, 90)),
        "max": float(values.max()),
        "truncated_share": float(np.mean(np.asarray(truncated, dtype=np.float64))),
    }


def length_by_correctness(lengths: Sequence[int], values: Sequence[float | None]) -> dict[str, float]:
    """Mean completion length of the right and of the wrong samples (``correct_mean``,
    ``wrong_mean``), right as :func:`is_correct` says; unscored samples (``None``) count in
    neither. A side with no sample is left out rather than logged as 0 (which would read as
    "answers got empty"). Dr.GRPO's length claim (Liu et al., arXiv 2503.20783 §3) is about the
    wrong answers: GRPO's per-sequence normalisation lets them grow."""
    if len(lengths) != len(values):
        raise ValueError(f"{len(lengths)} lengths for {len(values)} accuracy scores")
    right = [n for n, v in zip(lengths, values) if v is not None and is_correct(v)]
    wrong = [n for n, v in zip(lengths, values) if v is not None and not is_correct(v)]
    out = {}
    if right:
        out["correct_mean"] = math.fsum(right) / len(right)
    if wrong:
        out["wrong_mean"] = math.fsum(wrong) / len(wrong)
    return out
