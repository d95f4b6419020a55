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

import itertools
from pathlib import Path

import matplotlib.pyplot as plt
from mlflow.tracking import MlflowClient

from polyrl.analysis.compare_axis import Budget
from polyrl.analysis.curve_summaries import add_summaries, base_key, summary_keys
from polyrl.analysis.report_metrics import (
    CURVES,
    TABLE_METRICS,
    eval_headline_keys,
    headline_keys,
    is_eval_score,
    logged_metric_keys,
    metric_histories,
    save_curve_plot,
)
from polyrl.analysis.stats import (
    CONFIDENCE,
    Difference,
    arm_difference,
    curve_band,
    holm_adjusted,
    interquartile_mean,
    mean_interval,
    verdict,
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
# Logged at every training step (the loop's timing), so its last step is how far a seed run got.
STEP_CLOCK = "perf/step_s"

SeedHistories = dict[str, dict[str, dict[int, list[tuple[int, float]]]]]  # arm -> metric -> seed -> history


def finals(histories: SeedHistories, key: str) -> dict[str, dict[int, float]]:
    """Per arm, each seed's last logged value of ``key`` (seeds that never logged it are left out)."""
    return {
        arm: {seed: points[-1][1] for seed, points in by_key.get(key, {}).items() if points} for arm, by_key in histories.items()
    }


def seed_run_problem(status: str, last_step: int | None, planned_steps: int | None) -> str | None:
    """Why a seed run cannot count in the finals (``None`` when it can): it did not finish, or
    it stopped before its planned last step."""
    reached = "no step logged" if last_step is None else f"stopped at step {last_step}"
    if status != "FINISHED":
        return f"{status}, {reached}" + (f" of {planned_steps}" if planned_steps and last_step is not None else "")
    if planned_steps is not None and (last_step is None or last_step < planned_steps):
        return f"{reached}" + (f" of {planned_steps}" if last_step is not None else f" (planned {planned_steps})")
    return None


def finished_seed_runs(client: MlflowClient, seed_runs: dict[str, dict[int, str]]) -> tuple[dict[str, dict[int, str]], list[str]]:
    """The seed runs that count (FINISHED, reached their ``train.steps``), and one line per seed
    run left out saying why."""
    kept: dict[str, dict[int, str]] = {}
    left_out: list[str] = []
    for arm, by_seed in seed_runs.items():
        kept[arm] = {}
        for seed, run_id in sorted(by_seed.items()):
            run = client.get_run(run_id)
            steps = [m.step for m in client.get_metric_history(run_id, STEP_CLOCK)]
            planned = run.data.params.get("train.steps")
            problem = seed_run_problem(run.info.status, max(steps) if steps else None, int(planned) if planned else None)
            if problem is None:
                kept[arm][seed] = run_id
            else:
                left_out.append(f"{arm} seed {seed} (run `{run_id}`): {problem}")
    return kept, left_out


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
    out: Path,
    *,
    baseline: str | None = None,
    metrics: list[str] | None = None,
    budget: Budget | None = None,
):
    """Returns ``(report markdown, final table, plot paths, mean histories, verdict sentences,
    headline metrics)``.

    Seed runs that did not finish (:func:`finished_seed_runs`) are left out and named. With
    ``baseline``, each other arm is compared with it (not every pair); with ``metrics``, only
    those metrics get differences and changes (:func:`compared_metrics`). With ``budget`` (the
    finished runs' on ``--axis tokens|flops|seconds``), curves are drawn against its axis and each
    seed's value is its last one within the budget (:mod:`polyrl.analysis.compare_axis`)."""
    seed_runs, left_out = finished_seed_runs(client, seed_runs)
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
