"""The tables of differences in a seeded report, each with its interval and a verdict in words:
between arms (each pair, or each arm against a baseline; paired over the seeds both ran, else
Welch; Holm-corrected over the report's comparisons) and over training (each seed's last
held-out value minus its first, paired by seed), with the note saying how they were computed
(:mod:`polyrl.analysis.stats`).
"""

from __future__ import annotations

import itertools

from polyrl.analysis.report_metrics import SeedHistories, finals
from polyrl.analysis.stats import CONFIDENCE, Difference, arm_difference, holm_adjusted, verdict


def change_rows(histories: SeedHistories, keys: list[str]) -> list[tuple[str, str, Difference, float, str]]:
    """(metric, arm, last − first value with its interval, Holm-adjusted p, verdict) per arm and
    held-out metric: did the arm move it over training? Each seed's first value is the starting
    policy (the periodic eval runs at step 0), so the change is paired within the seed; Holm's
    adjustment runs over these rows (a family of its own, apart from the arm differences)."""
    found: list[tuple[str, str, Difference]] = []
    for key in keys:
        for arm, by_seed in histories.items():
            runs = {seed: points for seed, points in by_seed.get(key, {}).items() if len(points) >= 2}
            if runs:
                found.append(
                    (key, arm, arm_difference({s: p[-1][1] for s, p in runs.items()}, {s: p[0][1] for s, p in runs.items()}))
                )
    adjusted = holm_adjusted([difference.p_value for *_, difference in found])
    return [(key, arm, difference, p, _change_said(difference, p)) for (key, arm, difference), p in zip(found, adjusted)]


def _change_said(difference: Difference, adjusted_p: float) -> str:
    interval = difference.interval
    if interval.low != interval.low:
        return "one seed: no interval"
    if interval.contains(0.0):
        return "no change distinguishable from seed noise (the interval contains 0)"
    direction = "rose" if interval.estimate > 0 else "fell"
    return f"{direction} (the interval excludes 0{'' if adjusted_p < 0.05 else '; not after Holm correction'})"


def change_table(rows: list[tuple[str, str, Difference, float, str]]) -> str:
    lines = [
        f"| metric | arm | seeds | last − first | {CONFIDENCE:.0%} CI (paired by seed) | Holm-adjusted p | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, arm, difference, adjusted, said in rows:
        interval = difference.interval
        shown = "–" if interval.low != interval.low else f"[{interval.low:.3g}, {interval.high:.3g}]"
        p = "–" if adjusted != adjusted else f"{adjusted:.2g}"
        lines.append(f"| {key} | {arm} | {interval.n} | {interval.estimate:.3g} | {shown} | {p} | {said} |")
    return "\n".join(lines)


def compared_pairs(arms: list[str], baseline: str | None = None) -> list[tuple[str, str]]:
    """The (a, b) pairs whose difference a − b a report tests: each arm against ``baseline`` (in
    the arms' order), or every pair of arms when there is none. Nine arms make 36 pairs, and
    Holm's correction over all of them (times the metrics) leaves no verdict standing; against
    one baseline they are 8."""
    if baseline is None:
        return list(itertools.combinations(arms, 2))
    return [(arm, baseline) for arm in arms if arm != baseline]


def pairwise_rows(
    histories: SeedHistories, keys: list[str], *, baseline: str | None = None
) -> list[tuple[str, str, str, Difference, float, str]]:
    """(metric, arm a, arm b, a − b with its interval, Holm-adjusted p, verdict) for each compared
    pair (:func:`compared_pairs`: every pair, or each arm minus ``baseline``) and each metric, by
    metric then arm; Holm's adjustment runs over all these rows together."""
    found: list[tuple[str, str, str, Difference]] = []
    pairs = compared_pairs(list(histories), baseline)
    for key in keys:
        values = finals(histories, key)
        for first, second in pairs:
            if not values.get(first) or not values.get(second):
                continue
            found.append((key, first, second, arm_difference(values[first], values[second])))
    adjusted = holm_adjusted([difference.p_value for *_, difference in found])
    tested = sum(p == p for p in adjusted)
    return [
        (key, first, second, difference, p, verdict(difference.interval, names=(first, second), adjusted_p=p, comparisons=tested))
        for (key, first, second, difference), p in zip(found, adjusted)
    ]


def pairwise_table(rows: list[tuple[str, str, str, Difference, float, str]]) -> str:
    lines = [
        f"| metric | difference | mean difference | {CONFIDENCE:.0%} CI (method) | Holm-adjusted p | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for key, first, second, difference, adjusted, said in rows:
        interval = difference.interval
        shown = "–" if interval.low != interval.low else f"[{interval.low:.3g}, {interval.high:.3g}] ({difference.method})"
        p = "–" if adjusted != adjusted else f"{adjusted:.2g}"
        lines.append(f"| {key} | {first} − {second} | {interval.estimate:.3g} | {shown} | {p} | {said} |")
    return "\n".join(lines)


def comparison_note(rows: list[tuple[str, str, str, Difference, float, str]], baseline: str | None = None) -> str:
    """How the differences were computed and how many verdicts the correction covers."""
    methods = sorted({difference.method for _, _, _, difference, _, _ in rows})
    tested = sum(p == p for *_, p, _ in rows)
    said = {
        "paired": "paired: the mean of the per-seed differences over the seeds both arms ran, Student t with n − 1 degrees "
        "of freedom (arms at one seed share prompts, sampler seeds and warm start)",
        "Welch": "Welch: the arms do not share the same two or more finished seeds, so their means are compared unpaired",
    }
    return (
        " ".join(f"Intervals {said[m]}." for m in methods) + f" Verdicts are corrected for multiplicity with Holm's step-down "
        f"method over the {tested} comparisons of this report"
        + (f" (each arm against the baseline {baseline}, not every pair)" if baseline else "")
        + " (family-wise error 5%); the intervals shown are unadjusted."
    )
