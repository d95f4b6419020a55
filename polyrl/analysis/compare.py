"""``polyrl compare``: plots and a table of final values for the arms of an experiment.

Reads everything back from MLflow (not from local state), so it works on any experiment in
any tracking store, and logs the report to the experiment's parent run: as artifacts under
``comparison/`` and as the run's description (what the MLflow UI shows on the run's page).
An experiment run with ``seeds`` gets the statistics of :mod:`polyrl.analysis.seed_report`.
Every arm the experiment planned is listed with its status (:mod:`polyrl.analysis.arm_status`);
only runs that finished enter the tables, curves and intervals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
from mlflow.tracking import MlflowClient  # noqa: E402

from polyrl.analysis.arm_status import ArmStatus, arm_status, planned_arms, status_lines, unfinished_summary  # noqa: E402
from polyrl.analysis.compare_axis import Budget, axis_named, budget_for  # noqa: E402
from polyrl.analysis.compare_views import annotate_arm_runs, headline_summary, log_headline_metrics, write_chart_view  # noqa: E402
from polyrl.analysis.difference_tables import compared_pairs  # noqa: E402
from polyrl.analysis.example_runs import runs_example_rows  # noqa: E402
from polyrl.analysis.experiment_runs import (  # noqa: E402
    CompareError,
    experiment_arm_run_ids,
    experiment_arm_runs,
    finished_seed_runs,
    require_existing_store,
    seed_runs_of,
)
from polyrl.analysis.flip_pages import FLIPS_FOLDER, mlflow_sample_tables, write_flip_pages  # noqa: E402
from polyrl.analysis.health_notes import health_warnings, with_health_section  # noqa: E402
from polyrl.analysis.per_example_report import PairExamples, pair_examples, per_example_markdown, with_section  # noqa: E402
from polyrl.analysis.report_metrics import (  # noqa: E402
    eval_metric_keys,
    headline_keys,
)
from polyrl.analysis.seed_report import seeded_report  # noqa: E402
from polyrl.analysis.sequential_report import read_sequence, sequential_section  # noqa: E402
from polyrl.analysis.single_seed_report import single_seed_headline, single_seed_report  # noqa: E402
from polyrl.tracking.mlflow_runs import (  # noqa: E402
    NOTE_TAG,
    make_client,
)
from polyrl.tracking.ui_links import compare_runs_url, ui_base_url  # noqa: E402


@dataclass
class Comparison:
    experiment: str
    parent_run_id: str
    arms: dict[str, str]  # arm -> run id
    histories: dict[str, dict[str, list[tuple[int, float]]]]  # arm -> metric -> [(step, value)]
    table_markdown: str
    plot_paths: list[Path]
    out_dir: Path
    compare_url: str = ""
    seed_runs: dict[str, dict[int, str]] | None = None  # arm -> seed -> run id (the finished ones), when run with seeds
    verdicts: list[str] | None = None
    statuses: list[ArmStatus] | None = None  # every planned arm, in order
    unfinished: str | None = None  # a sentence naming the arms that did not finish; None when all did
    headline: dict[str, float] | None = None  # the figures logged as the parent run's metrics
    differences: list | None = None  # difference_tables.pairwise_rows: (metric, arm a, arm b, difference, Holm p, verdict)
    baseline: str | None = None  # each arm compared with this one (--baseline), else every pair
    metrics: list[str] | None = None  # the metrics compared (--metrics), else the default ones
    per_example: list[PairExamples] | None = None  # flip tables and intervals from the eval_examples artifacts
    axis: str = "step"  # --axis: what the curves are drawn against and the finals taken at
    budget: float | None = None  # on a compute axis, the most every compared run reached (where the finals are taken)


def default_report_dir(experiment: str) -> Path:
    """``reports/<slug of the experiment name>``: always inside ``reports``.

    MLflow experiment names may hold '/' (``tracking.experiment: team/probe``), so the name is
    made folder-safe rather than refused; ``..`` and absolute names cannot climb out. An
    explicit ``--out`` is the user's own path and may be anywhere, absolute included.
    """
    from polyrl.evals.models import slugify

    return Path("reports") / slugify(experiment)


def ui_note(report: str, *, parent_run_id: str, compare_url_fragment: str, summary: str = "") -> str:
    """The report as the parent run's MLflow description: plots read through the server's
    ``get-artifact`` endpoint (a relative link, so it works on whatever host serves the UI),
    and a link to the chart view of the arms. Cut to MLflow's tag length limit."""

    def artifact_link(match: re.Match) -> str:
        return f"![{match.group(1)}](get-artifact?path=comparison/{match.group(2)}&run_uuid={parent_run_id})"

    body = re.sub(r"!\[([^\]]*)\]\(([^)/]+\.png)\)", artifact_link, report)
    head = f"[Open the chart view of the arms]({compare_url_fragment}) · full report: artifacts `comparison/report.md`\n\n"
    if summary:  # before the report's title: the UI shows it above "Show more"
        head += summary + "\n\n"
    note = head + body
    limit = 7900  # mlflow.utils.validation.MAX_TAG_VAL_LENGTH is 8000
    if len(note) > limit:
        note = note[: limit - 80].rsplit("\n", 1)[0] + "\n\n… (cut; the full report is the artifact comparison/report.md)"
    return note


def _view_runs(arms: dict[str, str], kept: dict[str, dict[int, str]]) -> list[str]:
    """The runs the chart view is built from: the seed runs that count (``kept``), else the arm
    runs. With seeds, :func:`~polyrl.analysis.compare_views.write_chart_view` draws each arm's run
    (their per-step mean, in the arm's colour) and saves the seed runs grouped by arm as a second view."""
    if kept:
        return [run_id for by_seed in kept.values() for run_id in by_seed.values()]
    return list(arms.values())


def _chart_view(
    client: MlflowClient,
    parent,
    arms: dict[str, str],
    kept: dict[str, dict[int, str]],
    base_url: str,
    x_axis_metric: str | None = None,
) -> tuple[str, list[str]]:
    """The chart view's URL, and the eval metrics of the runs it shows (drawn against
    ``x_axis_metric``, a compute counter, when given; else against the step)."""
    run_ids = _view_runs(arms, kept)
    eval_keys = eval_metric_keys(client, run_ids)
    return write_chart_view(
        client,
        experiment_id=parent.info.experiment_id,
        parent_run_id=parent.info.run_id,
        run_ids=run_ids,
        eval_keys=eval_keys,
        grouped=True,
        base_url=base_url,
        x_axis_metric=x_axis_metric,
    ), eval_keys


def experiment_compare_url(experiment: str, *, tracking_uri: str, base_url: str | None = None) -> str:
    """The chart view of the newest run of ``experiment`` (its arms' step curves, one line per arm:
    the mean over its seeds where it has them), saved on the experiment first
    (:mod:`polyrl.analysis.compare_views`)."""
    require_existing_store(tracking_uri)
    client = make_client(tracking_uri)
    parent, arms = experiment_arm_run_ids(client, experiment, tracking_uri)
    _, seed_runs = seed_runs_of(client, parent, arms)
    kept = finished_seed_runs(client, seed_runs)[0] if seed_runs else {}
    return _chart_view(client, parent, arms, kept, base_url or ui_base_url(tracking_uri))[0]


def check_baseline(baseline: str | None, arms: list[str], experiment: str) -> None:
    """Refuse a ``--baseline`` that is not one of the experiment's arms, naming the arms."""
    if baseline is not None and baseline not in arms:
        raise CompareError(f"--baseline {baseline!r} is not an arm of experiment {experiment!r}; its arms: {', '.join(arms)}")


def compare_experiment(
    experiment: str,
    *,
    tracking_uri: str,
    out_dir: str | Path,
    log_to_mlflow: bool = True,
    baseline: str | None = None,
    metrics: list[str] | None = None,
    axis: str = "step",
) -> Comparison:
    """Compare the arms of the newest run of ``experiment``. With ``baseline`` (an arm), the
    differences are each other arm minus it, Holm-corrected over those only; else every pair.
    With ``metrics``, only those get differences (seeded experiments). With ``axis`` ``tokens``,
    ``flops`` or ``seconds``, curves are drawn against that compute counter and final values are
    taken at the most of it every compared run reached (:mod:`polyrl.analysis.compare_axis`)."""
    chosen_axis = axis_named(axis)
    require_existing_store(tracking_uri)
    client = make_client(tracking_uri)
    parent, arm_runs = experiment_arm_runs(client, experiment, tracking_uri)
    arms = {arm: run.info.run_id for arm, run in arm_runs.items()}
    order = list(dict.fromkeys(planned_arms(parent) + list(arm_runs)))
    check_baseline(baseline, order, experiment)
    all_seed_runs, seed_runs = seed_runs_of(client, parent, arms)
    statuses = [arm_status(arm, arm_runs.get(arm), all_seed_runs.get(arm)) for arm in order]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Only runs that finished are compared: a failed, stopped or running one has no final value
    # (the seed report leaves out and names each seed run that did not finish).
    finished = {status.arm for status in statuses if status.finished}
    # Which seed runs count is read once (each seed run's status and last step) for the tables,
    # the per-example section and the chart view.
    kept, left_out = finished_seed_runs(client, seed_runs) if seed_runs else ({}, [])
    compared = kept if seed_runs else {arm: {None: arms[arm]} for arm in order if arm in finished}
    budget = budget_for(client, chosen_axis, compared)
    if seed_runs:
        report, table, plot_paths, histories, rows, headline = seeded_report(
            client,
            experiment,
            parent.info.run_id,
            tracking_uri,
            kept,
            left_out,
            out,
            baseline=baseline,
            metrics=metrics,
            budget=budget,
        )
        verdicts = [row[5] for row in rows]
    else:
        if baseline is not None or metrics:
            raise CompareError(
                f"experiment {experiment!r} ran one seed per arm: its report has final values but no differences, so "
                "--baseline and --metrics would change nothing; run it with seeds (`seeds: 3`, or polyrl run … --seeds 0,1,2)"
            )
        report, table, plot_paths, histories = single_seed_report(
            client,
            experiment,
            parent.info.run_id,
            tracking_uri,
            {arm: run_id for arm, run_id in arms.items() if arm in finished},
            out,
            budget,
        )
        headline = single_seed_headline(histories)
        verdicts, rows = None, []
    per_example, section, flip_paths = _per_example(client, compared, baseline, budget, out)
    report = with_section(report, section)
    sequence = read_sequence(client, parent.info.run_id)
    if sequence:
        report = with_section(report, sequential_section(sequence))
    unfinished = unfinished_summary(statuses)
    report = with_status_section(report, statuses, unfinished)
    report = with_health_section(
        report, health_warnings({arm: [run, *all_seed_runs.get(arm, [])] for arm, run in arm_runs.items()})
    )
    (out / "report.md").write_text(report)
    base_url = ui_base_url(tracking_uri)
    url = compare_runs_url(base_url, parent.info.experiment_id, list(arms.values()))
    if log_to_mlflow:
        for path in plot_paths + [out / "report.md"]:
            client.log_artifact(parent.info.run_id, str(path), "comparison")
        for path in flip_paths:  # the report links them as flips/<file>
            client.log_artifact(parent.info.run_id, str(path), f"comparison/{FLIPS_FOLDER}")
        log_headline_metrics(client, parent.info.run_id, headline)
        annotate_arm_runs(client, parent.info.experiment_id, arm_runs, all_seed_runs)
        url, eval_keys = _chart_view(client, parent, arms, kept, base_url, budget and chosen_axis.counter)
        fragment = url[url.index("#") :]
        summary = headline_summary(headline, list(arms), headline_keys(eval_keys))
        client.set_tag(
            parent.info.run_id,
            NOTE_TAG,
            ui_note(report, parent_run_id=parent.info.run_id, compare_url_fragment=fragment, summary=summary),
        )
    return Comparison(
        experiment,
        parent.info.run_id,
        arms,
        histories,
        table,
        plot_paths,
        out,
        url,
        compared if seed_runs else None,  # the finished seed runs the figures are over (not running or failed ones)
        verdicts,
        statuses,
        unfinished,
        headline,
        rows,
        baseline,
        list(metrics) if metrics else None,
        per_example,
        chosen_axis.name,
        budget.value if budget else None,
    )


def _per_example(
    client: MlflowClient, runs: dict[str, dict], baseline: str | None, budget: Budget | None, out: Path
) -> tuple[list[PairExamples], str, list[Path]]:
    """The per-example comparison of the compared runs (arm -> seed -> run id), from their
    ``eval_examples/`` artifacts (each run's last evaluation, or its last within ``budget``), its
    report section (empty without artifacts), and the flip pages written under ``out/flips/``
    (:mod:`polyrl.analysis.flip_pages`), which the section links."""
    rows = runs_example_rows(client, runs, final_only=budget is None)
    rows = budget.example_rows(rows) if budget else rows
    pairs = pair_examples(rows, compared_pairs([arm for arm in runs if runs[arm]], baseline))
    links, paths = write_flip_pages(pairs, rows, mlflow_sample_tables(client), out)
    return pairs, per_example_markdown(pairs, rows, links), paths


def with_status_section(report: str, statuses: list[ArmStatus], unfinished: str | None) -> str:
    """The report with an "Arms" section (each arm's status) before its first section."""
    head, rule, rest = report.partition("\n## ")
    section = "\n".join(
        ["## Arms", "", *status_lines(statuses), "", f"**{unfinished}.**" if unfinished else "All arms finished.", ""]
    )
    return f"{head}\n{section}{rule}{rest}"
