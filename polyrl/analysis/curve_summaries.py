"""Summaries of a held-out curve as one number per seed, compared like final values.

A final value is one noisy evaluation; two summaries use the whole curve:

- ``<metric>/auc`` — the area under the curve by the trapezoid rule, divided by the step range
  it covers: the curve's mean height over training (a curve that rises early scores higher
  than one that gets to the same end late);
- ``<metric>/last<k>_mean`` — the mean of the last ``k`` evaluations: the end of training,
  with less evaluation noise than the last one alone.

They enter a seeded report's histories as one point per seed (at the curve's last step), so the
paired-by-seed intervals of :mod:`polyrl.analysis.seed_report` apply unchanged.
"""

from __future__ import annotations

import re
from typing import Sequence

LAST_K = 3
AUC_SUFFIX = "/auc"
LAST_K_SUFFIX = re.compile(r"/last(\d+)_mean$")


def curve_auc(points: Sequence[tuple[int, float]]) -> float:
    """Trapezoid area under ``(step, value)`` points divided by (last step − first step); one
    point: its value."""
    points = sorted(points)
    if len(points) == 1:
        return float(points[0][1])
    area = sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(points, points[1:]))
    return float(area / (points[-1][0] - points[0][0]))


def last_k_mean(points: Sequence[tuple[int, float]], k: int = LAST_K) -> float:
    """The mean of the last ``k`` values (all of them when there are fewer)."""
    tail = sorted(points)[-k:]
    return float(sum(value for _, value in tail) / len(tail))


def summary_keys(key: str, k: int = LAST_K) -> list[str]:
    return [f"{key}{AUC_SUFFIX}", f"{key}/last{k}_mean"]


def base_key(key: str) -> tuple[str, int | None] | None:
    """``(metric, k)`` of a summary key (k None for the area), else None."""
    if key.endswith(AUC_SUFFIX):
        return key[: -len(AUC_SUFFIX)], None
    match = LAST_K_SUFFIX.search(key)
    return (key[: match.start()], int(match.group(1))) if match else None


def summarise(points: Sequence[tuple[int, float]], key: str) -> list[tuple[int, float]]:
    """A summary key's one-point history from its metric's ``points`` (at the last step)."""
    parsed = base_key(key)
    if parsed is None or not points:
        return []
    _, k = parsed
    clean = [(int(step), float(value)) for step, value in points if value == value]
    if not clean:
        return []
    value = curve_auc(clean) if k is None else last_k_mean(clean, k)
    return [(max(step for step, _ in clean), value)]


def add_summaries(histories: dict, keys: Sequence[str]) -> list[str]:
    """Add each summary key of ``keys`` to seed histories (arm -> metric -> seed -> points)
    from its metric's points; returns the keys added that any seed has."""
    added = []
    for key in keys:
        parsed = base_key(key)
        if parsed is None:
            continue
        for by_key in histories.values():
            by_key[key] = {seed: summarise(points, key) for seed, points in by_key.get(parsed[0], {}).items()}
        if any(any(by_key[key].values()) for by_key in histories.values()):
            added.append(key)
    return added
