"""The report of an experiment run with one seed per arm: final values, the starting values
and one curve per arm for each metric; no intervals (one value per arm). ``polyrl compare``
uses it where the experiment has no ``seeds`` (:mod:`polyrl.analysis.seed_report` otherwise).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from polyrl.analysis.compare_axis import Budget
from polyrl.analysis.report_metrics import (
    CURVES,
    TABLE_METRICS,
    eval_metric_keys,
    headline_keys,
    metric_histories,
    save_curve_plot,
)
from polyrl.analysis.seed_report import metric_name


def _format(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.4g}"


def markdown_table(rows: dict[str, dict[str, float | None]], columns: list[str]) -> str:
    header = "| arm | " + " | ".join(columns) + " |"
    rule = "|---|" + "---|" * len(columns)
    lines = [header, rule]
    for arm, values in rows.items():
        lines.append(f"| {arm} | " + " | ".join(_format(values.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def plot_curves(
    histories: dict[str, dict[str, list[tuple[int, float]]]],
    keys: list[str],
    titles: dict[str, str],
    *,
    experiment: str,
    out: Path,
) -> list[Path]:
    """One PNG per metric: a line per arm."""
    plot_paths = []
    for key in keys:
        figure, axis = plt.subplots(figsize=(6, 3.6))
        drawn = False
        for arm, history in histories.items():
            points = history.get(key)
            if points:
                axis.plot([s for s, _ in points], [v for _, v in points], marker="o", markersize=2.5, label=arm)
                drawn = True
        if not drawn:
            plt.close(figure)
            continue
        axis.set_title(f"{experiment}: {titles[key]}")
        plot_paths.append(save_curve_plot(figure, axis, out, key))
    return plot_paths


def single_seed_headline(histories: dict[str, dict[str, list[tuple[int, float]]]]) -> dict[str, float]:
    """One seed per arm: each arm's last value of the compared metrics (``<arm>/<key>/final``);
    no interval (one value)."""
    keys = set(headline_keys([key for history in histories.values() for key in history if key.startswith("eval/")]))
    return {
        f"{metric_name(arm)}/{key}/final": points[-1][1]
        for arm, history in histories.items()
        for key, points in history.items()
        if points and key in keys
    }


def single_seed_report(client, experiment, parent_run_id, tracking_uri, arms, out, budget: Budget | None = None):
    eval_keys = eval_metric_keys(client, list(arms.values()))
    curve_keys = [key for key, _ in CURVES] + eval_keys
    histories = {
        arm: metric_histories(client, run_id, sorted(set(curve_keys) | set(TABLE_METRICS))) for arm, run_id in arms.items()
    }
    titles = dict(CURVES) | {key: key for key in eval_keys}
    if budget:  # against the compute axis; finals at the budget (one run per arm: "seed" None)
        wrapped = {arm: {key: {None: points} for key, points in history.items()} for arm, history in histories.items()}
        plot_paths = budget.plot(wrapped, curve_keys, titles, experiment=experiment, out=out, seeded=False)
        histories = {
            arm: {key: points[None] for key, points in history.items() if points[None]}
            for arm, history in budget.limited(wrapped).items()
        }
    else:
        plot_paths = plot_curves(histories, curve_keys, titles, experiment=experiment, out=out)
    columns = [key for key in TABLE_METRICS + tuple(eval_keys) if any(key in h for h in histories.values())]
    final = {arm: {key: history[key][-1][1] for key in columns if key in history} for arm, history in histories.items()}
    start_keys = ["reward/mean", "train/accuracy", "rollout/response_length/mean", *eval_keys]
    first = {arm: {key: history[key][0][1] for key in start_keys if key in history} for arm, history in histories.items()}
    table = markdown_table(final, columns)
    start_table = markdown_table(first, [c for c in start_keys if any(c in v for v in first.values())])
    report = "\n".join(
        [
            f"# {experiment}: comparison of arms",
            "",
            f"Parent run `{parent_run_id}` · tracking `{tracking_uri}`",
            "",
            f"## Final values ({budget.heading() if budget else 'last logged step'})",
            "",
            *([budget.note(), ""] if budget else []),
            table,
            "",
            "## Start (first logged step; eval metrics at step 0 are the starting policy)",
            "",
            start_table,
            "",
            "## Curves",
            "",
            *[f"![{p.stem}]({p.name})" for p in plot_paths],
            "",
        ]
    )
    return report, table, plot_paths, histories
