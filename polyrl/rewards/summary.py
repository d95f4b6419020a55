"""Summary statistics the eval harness reports beside the reward modules' scores."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def mean_of_scored(values: Sequence[float | None]) -> float:
    """Mean over the values that are not ``None``; NaN when none are."""
    scored = [float(v) for v in values if v is not None]
    return math.fsum(scored) / len(scored) if scored else float("nan")


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
