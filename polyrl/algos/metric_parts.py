"""How one micro-batch's metrics combine into one mini-batch's, one update's, one step's.

An objective reports its metrics per micro-batch; the learner combines them over the
micro-batches of an update and over the data-parallel ranks. Three kinds, each combined as its
meaning asks, so that the result does not depend on how the batch was cut:

- a *token mean* (``ratio_mean``, ``clip_frac_low``, ``entropy``, ...): weighted by the
  micro-batch's loss tokens, which is the mean over all tokens;
- a *ratio of two sums* (``pos_loss_share``, ``positive_share``, ``quadrant/*``): the objective
  also reports the numerator and the denominator (:func:`ratio_parts`), which are summed, and the
  result is their quotient. A mean of per-micro-batch ratios would weigh a micro-batch with one
  signed token as much as one with a thousand;
- an *extreme* (``ratio_max``, ``ratio_min``): the max or min over the micro-batches that have
  loss tokens (a micro-batch with none reports a neutral 1.0 that is no token's ratio).

:class:`MetricAccumulator` does all three; :meth:`MetricAccumulator.merged` combines the
accumulators of several ranks.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

__all__ = ["EXTREMES", "PARTS_PREFIX", "MetricAccumulator", "ratio_parts"]

PARTS_PREFIX = "parts/"
EXTREMES: dict[str, Callable[[float, float], float]] = {"ratio_max": max, "ratio_min": min}


def ratio_parts(name: str, numerator: float, denominator: float) -> dict[str, float]:
    """The two sums behind the ratio metric ``name``, as metric entries the learner sums."""
    return {f"{PARTS_PREFIX}{name}/numerator": float(numerator), f"{PARTS_PREFIX}{name}/denominator": float(denominator)}


class MetricAccumulator:
    """Sums of one update's micro-batch metrics (see the module docstring)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.parts: dict[str, float] = {}
        self.extremes: dict[str, float] = {}

    def add(self, metrics: dict[str, float], weight: float) -> None:
        """One micro-batch's metrics; ``weight``: its loss tokens (1 for a once-per-step value)."""
        for key, value in metrics.items():
            if key.startswith(PARTS_PREFIX):
                self.parts[key] = self.parts.get(key, 0.0) + value
                continue
            if key in EXTREMES and weight > 0:  # a micro-batch without loss tokens has no extreme
                self.extremes[key] = EXTREMES[key](self.extremes.get(key, value), value)
            # The mean too: what an extreme falls back to where no micro-batch had tokens.
            self.sums[key] = self.sums.get(key, 0.0) + value * weight
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def state(self) -> tuple[dict[str, float], ...]:
        return self.sums, self.weights, self.parts, self.extremes

    @classmethod
    def merged(cls, states: Iterable[tuple[dict[str, float], ...]]) -> "MetricAccumulator":
        """One accumulator from several ranks' :meth:`state`."""
        out = cls()
        for sums, weights, parts, extremes in states:
            for target, source in ((out.sums, sums), (out.weights, weights), (out.parts, parts)):
                for key, value in source.items():
                    target[key] = target.get(key, 0.0) + value
            for key, value in extremes.items():
                out.extremes[key] = EXTREMES[key](out.extremes.get(key, value), value)
        return out

    def result(self) -> dict[str, float]:
        """Every metric's combined value: ratios of summed parts, extremes, else token means.
        A ratio whose summed denominator is 0 keeps the mean of what the micro-batches reported
        for that case (or stays absent, as they left it)."""
        out = {key: value / max(self.weights.get(key, 0.0), 1e-12) for key, value in self.sums.items()}
        for key, value in self.extremes.items():
            out[key] = value
        names = {key[len(PARTS_PREFIX) :].rsplit("/", 1)[0] for key in self.parts}
        for name in names:
            denominator = self.parts.get(f"{PARTS_PREFIX}{name}/denominator", 0.0)
            if denominator > 0 and math.isfinite(denominator):
                out[name] = self.parts.get(f"{PARTS_PREFIX}{name}/numerator", 0.0) / denominator
        return out
