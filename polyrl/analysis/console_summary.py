"""What ``polyrl compare`` prints: the verdicts and a few headline figures, fitted to the
terminal. The full table (every metric, IQM, the per-example section) is in report.md.

Before, the command printed the report's whole final-value table: 16 columns that wrapped at
80 characters, each cell repeating ``(n=1) (IQM …)`` even with one seed.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from rich.table import Table

from polyrl.analysis.report_metrics import headline_keys
from polyrl.analysis.seed_report import metric_name
from polyrl.analysis.stats import CONFIDENCE

MOST_METRICS = 3  # headline columns in the figures table
MOST_VERDICTS = 8  # difference rows printed; the rest are in report.md


def _figure(headline: dict[str, float], arm: str, key: str) -> str:
    base = f"{metric_name(arm)}/{key}"
    final = headline.get(f"{base}/final")
    if final is None:
        return "–"
    low, high = headline.get(f"{base}/ci_low"), headline.get(f"{base}/ci_high")
    return f"{final:.3g}" if low is None or high is None else f"{final:.3g} [{low:.3g}, {high:.3g}]"


def shown_keys(comparison: Any, most: int = MOST_METRICS) -> list[str]:
    """The headline metrics (held-out scores first) that some arm has a final value of."""
    headline = comparison.headline or {}
    eval_keys = sorted({key for history in comparison.histories.values() for key in history if key.startswith("eval/")})
    keys = [
        key for key in headline_keys(eval_keys) if any(f"{metric_name(arm)}/{key}/final" in headline for arm in comparison.arms)
    ]
    return keys[:most]


def figures_table(comparison: Any, *, most: int = MOST_METRICS) -> Table | None:
    """Per arm: its finished seeds and each headline metric's mean over them with its
    interval (one seed: the value alone)."""
    keys = shown_keys(comparison, most)
    if not keys:
        return None
    seeded = bool(comparison.seed_runs)
    title = f"final values: mean over seeds [{CONFIDENCE:.0%} CI]" if seeded else "final values (one seed per arm)"
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("arm", overflow="fold")
    if seeded:
        table.add_column("seeds", justify="right")
    for key in keys:
        table.add_column(key, overflow="fold")
    for arm in comparison.arms:
        seeds = [str(len((comparison.seed_runs or {}).get(arm, {})))] if seeded else []
        table.add_row(arm, *seeds, *(_figure(comparison.headline or {}, arm, key) for key in keys))
    return table


def short_verdict(difference: Any, adjusted_p: float, first: str, second: str) -> str:
    interval = difference.interval
    if math.isnan(interval.low):
        return "too few seeds"
    if interval.contains(0.0):
        return "not distinguishable"
    better = first if interval.estimate > 0 else second
    p = "<0.001" if adjusted_p < 0.001 else f"{adjusted_p:.2g}"
    if not adjusted_p < 1 - CONFIDENCE:
        return f"{better} higher before Holm only (p {p})"
    return f"{better} higher (Holm p {p})"


def _ordered(rows: Sequence[tuple], keys: list[str]) -> list[tuple]:
    """Headline metrics first (in their order), then the rest as the report lists them."""
    rank = {key: index for index, key in enumerate(keys)}
    return sorted(rows, key=lambda row: rank.get(row[0], len(rank)))


def verdicts_table(comparison: Any, *, most: int = MOST_VERDICTS) -> tuple[Table | None, int]:
    """The differences with their intervals and verdicts (headline metrics first), and how
    many more the report has."""
    rows = list(comparison.differences or [])
    if not rows:
        return None, 0
    keys = shown_keys(comparison, most=len(rows) + MOST_METRICS)
    table = Table(title=f"differences ({CONFIDENCE:.0%} CI, paired by seed; Holm-corrected verdicts)", title_justify="left")
    table.add_column("metric", overflow="fold", ratio=3)
    table.add_column("a − b", overflow="fold", ratio=2)
    table.add_column("difference [CI]", overflow="fold", ratio=2)
    table.add_column("verdict", overflow="fold", ratio=3)
    for key, first, second, difference, adjusted, _ in _ordered(rows, keys)[:most]:
        interval = difference.interval
        shown = f"{interval.estimate:.3g}" + ("" if math.isnan(interval.low) else f" [{interval.low:.3g}, {interval.high:.3g}]")
        table.add_row(key, f"{first} − {second}", shown, short_verdict(difference, adjusted, first, second))
    return table, max(0, len(rows) - most)


def per_example_lines(comparison: Any) -> list[str]:
    """One line per pair and dataset with per-example rows: the pooled flips and the recipe interval."""
    lines = []
    for pair in comparison.per_example or []:
        recipe = pair.recipe
        interval = "" if math.isnan(recipe.low) else f" [{recipe.low:.3g}, {recipe.high:.3g}]"
        lines.append(
            f"{pair.dataset}: {pair.first} − {pair.second}: solved by only {pair.first} {pair.pooled.only_a}, "
            f"only {pair.second} {pair.pooled.only_b} (of {pair.pooled.examples} example-seeds); "
            f"recipe {recipe.estimate:+.3g}{interval} at {recipe.n} seed{'s' if recipe.n != 1 else ''}"
        )
    return lines


def console_summary(comparison: Any) -> list[Any]:
    """Renderables for a rich Console: the verdicts, the headline figures, the per-example
    summary; tables shrink their columns to the console's width."""
    out: list[Any] = []
    verdicts, more = verdicts_table(comparison)
    if verdicts is not None:
        out.append(verdicts)
        if more:
            out.append(f"… {more} more differences in the report")
    figures = figures_table(comparison)
    if figures is not None:
        out.append(figures)
    lines = per_example_lines(comparison)
    if lines:
        out += ["per-example (held-out, last evaluation; flips pooled over seeds):", *[f"  {line}" for line in lines]]
    return out
