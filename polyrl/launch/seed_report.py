"""The comparison report of an experiment run with ``seeds``: arms compared over seeds.

Per-step curves are the mean over seeds with a shaded 95% t-band; each seed's final value is
its last logged value; per arm the table gives mean ± 95% CI and the interquartile mean
(rliable's IQM, Agarwal et al. 2021); for each pair of arms the difference of means gets a
Welch interval and a verdict in words (:mod:`polyrl.launch.stats`).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib.pyplot as plt
from mlflow.tracking import MlflowClient

from polyrl.launch.compare import CURVES, TABLE_METRICS, _eval_keys, _histories, is_eval_score, save_curve_plot
from polyrl.launch.stats import CONFIDENCE, Interval, curve_band, interquartile_mean, mean_interval, verdict, welch_difference

# Metrics whose difference between arms gets a verdict (plus each eval accuracy).
PAIRWISE_METRICS: tuple[str, ...] = ("train/accuracy", "reward/mean", "rollout/response_length/mean", "actor/entropy")

SeedHistories = dict[str, dict[str, list[list[tuple[int, float]]]]]  # arm -> metric -> one history per seed


def finals(histories: SeedHistories, key: str) -> dict[str, list[float]]:
    """Per arm, each seed's last logged value of ``key`` (seeds that never logged it are left out)."""
    return {arm: [points[-1][1] for points in by_key.get(key, []) if points] for arm, by_key in histories.items()}


def final_table(histories: SeedHistories, columns: list[str], seed_counts: dict[str, int]) -> str:
    """| arm | seeds | metric: mean ± CI half-width (IQM) | …"""
    header = "| arm | seeds | " + " | ".join(columns) + " |"
    lines = [header, "|---|---|" + "---|" * len(columns)]
    for arm in histories:
        cells = []
        for key in columns:
            values = finals(histories, key)[arm]
            if not values:
                cells.append("–")
                continue
            cells.append(f"{mean_interval(values).format()} (IQM {interquartile_mean(values):.3g})")
        lines.append(f"| {arm} | {seed_counts[arm]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pairwise_rows(histories: SeedHistories, keys: list[str]) -> list[tuple[str, str, str, Interval, str]]:
    """(metric, arm a, arm b, a − b with its Welch interval, verdict) for each pair of arms."""
    rows = []
    for key in keys:
        values = finals(histories, key)
        for first, second in itertools.combinations(list(histories), 2):
            if not values[first] or not values[second]:
                continue
            difference = welch_difference(values[first], values[second])
            rows.append((key, first, second, difference, verdict(difference, names=(first, second))))
    return rows


def pairwise_table(rows: list[tuple[str, str, str, Interval, str]]) -> str:
    lines = [f"| metric | difference | mean difference | {CONFIDENCE:.0%} Welch CI | verdict |", "|---|---|---|---|---|"]
    for key, first, second, difference, said in rows:
        interval = "–" if difference.low != difference.low else f"[{difference.low:.3g}, {difference.high:.3g}]"
        lines.append(f"| {key} | {first} − {second} | {difference.estimate:.3g} | {interval} | {said} |")
    return "\n".join(lines)


def plot_bands(histories: SeedHistories, keys: list[str], titles: dict[str, str], *, experiment: str, out: Path) -> list[Path]:
    """One PNG per metric: per arm the mean over seeds and a shaded 95% t-band."""
    paths = []
    for key in keys:
        figure, axis = plt.subplots(figsize=(6, 3.6))
        drawn = False
        seeds_seen = 0
        for arm, by_key in histories.items():
            runs = [points for points in by_key.get(key, []) if points]
            if not runs:
                continue
            steps, mean, low, high = curve_band(runs)
            line, = axis.plot(steps, mean, marker="o", markersize=2.5, label=f"{arm} (n={len(runs)})")
            axis.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            seeds_seen = max(seeds_seen, len(runs))
            drawn = True
        if not drawn:
            plt.close(figure)
            continue
        axis.set_title(f"{experiment}: {titles[key]}\nmean over seeds, shaded: {CONFIDENCE:.0%} CI", fontsize=9)
        paths.append(save_curve_plot(figure, axis, out, key, legend_fontsize=8))
    return paths


def seeded_report(client: MlflowClient, experiment: str, parent_run_id: str, tracking_uri: str,
                  seed_runs: dict[str, dict[int, str]], out: Path):
    """Returns ``(report markdown, final table, plot paths, mean histories, verdict sentences)``."""
    run_ids = [run_id for by_seed in seed_runs.values() for run_id in by_seed.values()]
    eval_keys = _eval_keys(client, run_ids)
    curve_keys = [key for key, _ in CURVES] + eval_keys
    keys = sorted(set(curve_keys) | set(TABLE_METRICS))
    histories: SeedHistories = {}
    for arm, by_seed in seed_runs.items():
        per_seed = [_histories(client, run_id, keys) for _, run_id in sorted(by_seed.items())]
        histories[arm] = {key: [h.get(key, []) for h in per_seed] for key in keys}
    titles = dict(CURVES) | {key: key for key in eval_keys}
    plot_paths = plot_bands(histories, curve_keys, titles, experiment=experiment, out=out)
    columns = [key for key in TABLE_METRICS + tuple(eval_keys) if any(any(h) for h in (by_key.get(key, []) for by_key in histories.values()))]
    counts = {arm: len(by_seed) for arm, by_seed in seed_runs.items()}
    table = final_table(histories, columns, counts)
    pair_keys = [key for key in (*PAIRWISE_METRICS, *[k for k in eval_keys if is_eval_score(k)]) if key in columns]
    rows = pairwise_rows(histories, pair_keys)
    seeds_line = " · ".join(f"{arm}: seeds {', '.join(map(str, sorted(by_seed)))}" for arm, by_seed in seed_runs.items())
    report = "\n".join([
        f"# {experiment}: comparison of arms over seeds",
        "",
        f"Parent run `{parent_run_id}` · tracking `{tracking_uri}` · {seeds_line}",
        "",
        f"## Final values (each seed's last logged step): mean ± {CONFIDENCE:.0%} CI half-width (Student t), IQM",
        "",
        table,
        "",
        f"## Differences between arms (final values; Welch {CONFIDENCE:.0%} interval)",
        "",
        pairwise_table(rows) if rows else "(fewer than two arms: nothing to compare)",
        "",
        "A difference whose interval contains 0 is not distinguishable from seed noise at this number of seeds: "
        "more seeds narrow the interval, roughly as 1/√n.",
        "",
        "## Curves (mean over seeds, shaded 95% CI)",
        "",
        *[f"![{p.stem}]({p.name})" for p in plot_paths],
        "",
    ])
    mean_histories = {arm: {key: list(zip(*curve_band([p for p in runs if p])[:2])) for key, runs in by_key.items() if any(runs)}
                      for arm, by_key in histories.items()}
    return report, table, plot_paths, mean_histories, [row[4] for row in rows]
