"""The comparison report of an experiment run with ``seeds``: arms compared over seeds.

Only seed runs that finished are counted: a seed run whose MLflow status is not FINISHED, or
that did not reach its ``train.steps``, is left out of the curves and the finals, and the report
names it (before, a seed that stopped at step 12 had its step-12 value averaged with the
others' final ones). Per-step curves are the mean over seeds with a shaded 95% t-band; each
seed's final value is its last logged value (with ``polyrl compare --axis tokens|flops|seconds``,
its last within the compute every run reached: :mod:`polyrl.analysis.compare_axis`); per arm the table gives mean ± 95% CI and the
interquartile mean (rliable's IQM, Agarwal et al. 2021); for each pair of arms the difference
of means gets a paired interval over the seeds both ran (else Welch) and a verdict in words,
Holm-corrected over all the report's comparisons (:mod:`polyrl.analysis.stats`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from mlflow.tracking import MlflowClient

from polyrl.analysis.compare_axis import Budget
from polyrl.analysis.curve_summaries import add_summaries, base_key, summary_keys
from polyrl.analysis.difference_tables import change_rows, change_table, comparison_note, pairwise_rows, pairwise_table
from polyrl.analysis.report_metrics import (
    CURVES,
    TABLE_METRICS,
    SeedHistories,
    eval_headline_keys,
    finals,
    headline_keys,
    is_eval_score,
    logged_metric_keys,
    metric_histories,
    save_curve_plot,
)
from polyrl.analysis.stats import (
    CONFIDENCE,
    Difference,
    curve_band,
    interquartile_mean,
    mean_interval,
)
from polyrl.core.errors import PolyrlError

# Metrics whose difference between arms gets a verdict (plus each eval accuracy).
PAIRWISE_METRICS: tuple[str, ...] = (
    "train/accuracy",
    "reward/mean",
    "rollout/response_length/mean",
    "rollout/response_length/wrong_mean",
    "actor/entropy",
)


def final_table(histories: SeedHistories, columns: list[str], seed_counts: dict[str, int]) -> str:
    """| arm | seeds | metric: mean ± CI half-width (IQM) | …"""
    header = "| arm | seeds | " + " | ".join(columns) + " |"
    lines = [header, "|---|---|" + "---|" * len(columns)]
    for arm in histories:
        cells = []
        for key in columns:
            values = list(finals(histories, key)[arm].values())
            if not values:
                cells.append("–")
                continue
            cells.append(f"{mean_interval(values).format()} (IQM {interquartile_mean(values):.3g})")
        lines.append(f"| {arm} | {seed_counts[arm]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compared_metrics(metrics: list[str], logged: list[str]) -> list[str]:
    """The metrics asked for (``polyrl compare --metrics``), checked against those the finished
    seed runs logged (any of them, not only the default table's columns: a study's own metric,
    such as ``rollout_corr/kl``, is compared the same way); an unknown one is refused, naming the
    ones there are."""
    unknown = [key for key in metrics if key not in logged]
    if unknown:
        raise PolyrlError(
            f"--metrics: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not logged by the finished seed runs; "
            f"the metrics there are: {', '.join(sorted(logged))}"
        )
    return list(dict.fromkeys(metrics))


def metric_name(text: str) -> str:
    """An arm name as part of an MLflow metric key (letters, digits, ``_ - . /`` and spaces)."""
    import re

    return re.sub(r"[^A-Za-z0-9_\-. /]+", "_", text)


def headline_metrics(
    histories: SeedHistories,
    keys: list[str],
    rows: list[tuple[str, str, str, Difference, float, str]],
    changes: list[tuple[str, str, Difference, float, str]] = (),
) -> dict[str, float]:
    """The comparison's headline figures as metrics of the parent run, so the runs table shows
    and sorts by them: per arm and key the mean over seeds of the final values with its 95%
    interval (``<arm>/<key>/final``, ``/ci_low``, ``/ci_high``), and per compared pair the
    difference (``diff/<a>_minus_<b>/<key>/estimate``, ``/ci_low``, ``/ci_high``), and per arm
    and held-out metric the change over training (``<arm>/<key>/change/estimate``, …). Bounds that
    are undefined (one seed) are left out, not logged as NaN."""
    out: dict[str, float] = {}

    def put(prefix: str, interval, first: str) -> None:
        for name, value in ((first, interval.estimate), ("ci_low", interval.low), ("ci_high", interval.high)):
            if value == value:
                out[f"{prefix}/{name}"] = float(value)

    for key in keys:
        for arm, values in finals(histories, key).items():
            if values:
                put(f"{metric_name(arm)}/{key}", mean_interval(list(values.values())), "final")
    for key, first, second, difference, _, _ in rows:
        put(f"diff/{metric_name(first)}_minus_{metric_name(second)}/{key}", difference.interval, "estimate")
    for key, arm, difference, _, _ in changes:  # <arm>/<key>/change/{estimate,ci_low,ci_high}
        put(f"{metric_name(arm)}/{key}/change", difference.interval, "estimate")
    return out


def plot_bands(histories: SeedHistories, keys: list[str], titles: dict[str, str], *, experiment: str, out: Path) -> list[Path]:
    """One PNG per metric: per arm the mean over seeds and a shaded 95% t-band."""
    paths = []
    for key in keys:
        figure, axis = plt.subplots(figsize=(6, 3.6))
        drawn = False
        seeds_seen = 0
        for arm, by_key in histories.items():
            runs = [points for points in by_key.get(key, {}).values() if points]
            if not runs:
                continue
            steps, mean, low, high = curve_band(runs)
            (line,) = axis.plot(steps, mean, marker="o", markersize=2.5, label=f"{arm} (n={len(runs)})")
            axis.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            seeds_seen = max(seeds_seen, len(runs))
            drawn = True
        if not drawn:
            plt.close(figure)
            continue
        axis.set_title(f"{experiment}: {titles[key]}\nmean over seeds, shaded: {CONFIDENCE:.0%} CI", fontsize=9)
        paths.append(save_curve_plot(figure, axis, out, key, legend_fontsize=8))
    return paths


def seeded_report(
    client: MlflowClient,
    experiment: str,
    parent_run_id: str,
    tracking_uri: str,
    seed_runs: dict[str, dict[int, str]],
    left_out: list[str],
    out: Path,
    *,
    baseline: str | None = None,
    metrics: list[str] | None = None,
    budget: Budget | None = None,
):
    """Returns ``(report markdown, final table, plot paths, mean histories, verdict sentences,
    headline metrics)``.

    ``seed_runs`` are the seed runs that count (:func:`~polyrl.analysis.experiment_runs.finished_seed_runs`);
    ``left_out`` names the others, which the report lists. With
    ``baseline``, each other arm is compared with it (not every pair); with ``metrics``, only
    those metrics get differences and changes (:func:`compared_metrics`). With ``budget`` (the
    finished runs' on ``--axis tokens|flops|seconds``), curves are drawn against its axis and each
    seed's value is its last one within the budget (:mod:`polyrl.analysis.compare_axis`)."""
    run_ids = [run_id for by_seed in seed_runs.values() for run_id in by_seed.values()]
    logged = logged_metric_keys(client, run_ids)
    eval_keys = eval_headline_keys(logged)
    curve_keys = [key for key, _ in CURVES] + eval_keys
    # Curve summaries of the held-out scores (area, mean of the last evaluations): derived, not logged.
    summaries = [summary for key in eval_keys if is_eval_score(key) for summary in summary_keys(key)]
    derivable = [key for key in metrics or [] if base_key(key) and base_key(key)[0] in logged]
    # Metrics asked for beyond the default table (a study's own, e.g. rollout_corr/kl) get a column too.
    asked = compared_metrics(metrics, logged + derivable) if metrics else []
    own = tuple(key for key in asked if key not in TABLE_METRICS and key not in eval_keys)
    fetched = [base_key(key)[0] if base_key(key) else key for key in own]
    keys = sorted(set(curve_keys) | set(TABLE_METRICS) | set(fetched))
    histories: SeedHistories = {}
    for arm, by_seed in seed_runs.items():
        per_seed = {seed: metric_histories(client, run_id, keys) for seed, run_id in sorted(by_seed.items())}
        histories[arm] = {key: {seed: h.get(key, []) for seed, h in per_seed.items()} for key in keys}
    drawn, histories = histories, (budget.limited(histories) if budget else histories)
    summaries = add_summaries(histories, list(dict.fromkeys(summaries + [key for key in own if base_key(key)])))
    titles = dict(CURVES) | {key: key for key in eval_keys}
    plot_paths = (
        budget.plot(drawn, curve_keys, titles, experiment=experiment, out=out, seeded=True)
        if budget
        else plot_bands(histories, curve_keys, titles, experiment=experiment, out=out)
    )
    columns = [
        key
        for key in dict.fromkeys(TABLE_METRICS + tuple(eval_keys) + tuple(summaries) + own)
        if any(any(h.values()) for h in (by_key.get(key, {}) for by_key in histories.values()))
    ]
    counts = {arm: len(by_seed) for arm, by_seed in seed_runs.items()}
    table = final_table(histories, columns, counts)
    # Held-out scores, and the held-out length of the wrong answers (Dr.GRPO's length claim).
    pair_keys = [
        key
        for key in (*PAIRWISE_METRICS, *[k for k in eval_keys if is_eval_score(k) or k.endswith("/length/wrong_mean")])
        if key in columns
    ]
    if metrics:
        pair_keys = asked
    rows = pairwise_rows(histories, pair_keys, baseline=baseline)
    # Curve summaries are a Holm family of their own (asked for with --metrics, they join the others).
    curve_rows = [] if metrics else pairwise_rows(histories, [k for k in summaries if k in columns], baseline=baseline)
    changes = change_rows(histories, [key for key in eval_keys if key in columns and (not metrics or key in metrics)])
    no_baseline = baseline is not None and not any(finals(histories, key).get(baseline) for key in pair_keys)
    seeds_line = " · ".join(
        f"{arm}: seeds {', '.join(map(str, sorted(by_seed))) or 'none finished'}" for arm, by_seed in seed_runs.items()
    )
    left_out_lines = (
        [
            "## Seed runs left out (not finished: not in the curves, the table or the differences)",
            "",
            *[f"- {line}" for line in left_out],
            "",
        ]
        if left_out
        else []
    )
    finals_taken = budget.heading() if budget else "each seed's last logged step"
    report = "\n".join(
        [
            f"# {experiment}: comparison of arms over seeds",
            "",
            f"Parent run `{parent_run_id}` · tracking `{tracking_uri}` · {seeds_line}",
            "",
            *left_out_lines,
            f"## Final values ({finals_taken}): mean ± {CONFIDENCE:.0%} CI half-width (Student t), IQM",
            "",
            *([budget.note(), ""] if budget else []),
            table,
            "",
            (
                f"## Differences from the baseline {baseline} (each arm − {baseline}; final values; {CONFIDENCE:.0%} "
                "interval, paired by seed where the arms share seeds)"
                if baseline
                else f"## Differences between arms (final values; {CONFIDENCE:.0%} interval, paired by seed where the arms "
                "share seeds)"
            ),
            "",
            pairwise_table(rows)
            if rows
            else (
                f"(the baseline {baseline} has no finished seed run with these metrics: nothing to compare against)"
                if no_baseline
                else "(fewer than two arms: nothing to compare)"
            ),
            "",
            *([comparison_note(rows, baseline), ""] if rows else []),
            "A difference whose interval contains 0 is not distinguishable from seed noise at this number of seeds: "
            "more seeds narrow the interval, roughly as 1/√n.",
            "",
            *(
                [
                    "## Change over training (held-out metrics: each seed's last value minus its first, the starting policy's)",
                    "",
                    change_table(changes),
                    "",
                ]
                if changes
                else []
            ),
            *(
                [
                    "## Curve summaries of the held-out scores (each seed's area under the curve divided by its step "
                    "range, and mean of its last evaluations; paired by seed)",
                    "",
                    pairwise_table(curve_rows),
                    "",
                    f"Holm's correction runs over these {sum(row[4] == row[4] for row in curve_rows)} comparisons, a "
                    "family apart from the final values'.",
                    "",
                ]
                if curve_rows
                else []
            ),
            f"## Curves (mean over seeds, shaded 95% CI{f'; against {budget.axis.label}' if budget else ''})",
            "",
            *[f"![{p.stem}]({p.name})" for p in plot_paths],
            "",
        ]
    )
    mean_histories = {
        arm: {
            key: list(zip(*curve_band([p for p in runs.values() if p])[:2])) for key, runs in by_key.items() if any(runs.values())
        }
        for arm, by_key in histories.items()
    }
    keys = [key for key in headline_keys(eval_keys) if key in columns] + [key for key in own if key in columns]
    return (
        report,
        table,
        plot_paths,
        mean_histories,
        rows,
        headline_metrics(histories, keys, [row for row in rows if row[0] in keys], [row for row in changes if row[0] in keys]),
    )
