"""What ``polyrl compare`` leaves in the MLflow UI besides the report: the chart view of the arms
(the URL polyrl prints), the headline figures as metrics of the parent run, and on each arm's
run links to its sample pages.

- The chart view (:mod:`polyrl.tracking.chart_view`) draws one curve per arm in its arm's
  colour, with the step curves of the held-out scores, the response length, reward and
  training accuracy first. Without seeds the curves are the arm runs. With seeds they are the
  arm runs too, which hold the per-step mean over their seed runs (this module logs the
  compared metrics the arm runs lack, the held-out ones); a second saved view (``…-seeds``)
  groups the seed runs by arm: mean and min–max band, but in colours the UI derives from each
  group (see chart_view). Each arm run's description links to it.
- The headline figures are logged at step 0 of the parent run, whose row in the runs table
  then shows and sorts by them (before, the parent run had no metrics).
- Each arm run's description links to the last sample tables of its runs (training and
  held-out eval), one click from the arm run's page.
"""

from __future__ import annotations

import time

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from polyrl.analysis.report_metrics import headline_keys
from polyrl.tracking.chart_view import chart_view_state, colour_runs, save_chart_view, seeds_view_key, view_key
from polyrl.tracking.mlflow_runs import ARM_TAG, NOTE_TAG
from polyrl.tracking.ui_links import MODEL_TRAINING_MODE, chart_view_url

PARENT_TAG = "mlflow.parentRunId"  # MLflow nests a run under its parent by this tag
SAMPLE_FOLDERS: tuple[tuple[str, str], ...] = (("samples", "training samples"), ("eval_samples", "held-out eval samples"))
MLFLOW_BATCH = 1000  # metrics per log_batch call (MLflow's limit)


def write_chart_view(
    client: MlflowClient,
    *,
    experiment_id: str,
    parent_run_id: str,
    run_ids: list[str],
    eval_keys: list[str],
    grouped: bool,
    base_url: str,
    x_axis_metric: str | None = None,
) -> str:
    """Save the chart view of these runs on the experiment and return its URL. With
    ``x_axis_metric`` (a compute counter, ``polyrl compare --axis``) every line chart is drawn
    against that metric instead of the step (:func:`with_x_axis_metric`).

    Each run is tagged with its arm's colour (:func:`polyrl.tracking.chart_view.colour_runs`).
    When arms have several runs (seeds) and ``grouped``, the view draws each arm's run (the
    parent of its seed runs, holding their per-step mean); the seed runs grouped by arm are
    saved as a second view (:func:`polyrl.tracking.chart_view.
    seeds_view_key`). A group is drawn in a colour the UI derives from the group itself, which
    no tag or view state sets, so the linked view draws runs."""
    runs = {run_id: client.get_run(run_id) for run_id in run_ids}
    run_arms = {run_id: run.data.tags.get(ARM_TAG, run_id) for run_id, run in runs.items()}
    keys = headline_keys(eval_keys)
    seeded = grouped and len(set(run_arms.values())) < len(run_arms)
    arm_runs = _arm_runs(runs, run_arms) if seeded else None
    if not arm_runs:  # one run per arm (or seed runs without an arm run): draw the runs themselves
        colour_runs(client, run_arms)
        logged = sorted({key for run in runs.values() for key in run.data.metrics})
        state = with_x_axis_metric(
            chart_view_state(run_ids, keys, group_by_tag=ARM_TAG if seeded else None, other_keys=logged), x_axis_metric
        )
        key = view_key(parent_run_id)
        save_chart_view(client, experiment_id, key, state)
        return chart_view_url(base_url, experiment_id, key)
    for arm_run_id, seed_ids in arm_runs.items():  # the arm run is drawn against the counter too: its mean as well
        log_mean_over_seeds(client, arm_run_id, seed_ids, keys + ([x_axis_metric] if x_axis_metric else []))
    arm_ids = list(arm_runs)
    colour_runs(client, {**{arm_id: run_arms[seed_ids[0]] for arm_id, seed_ids in arm_runs.items()}, **run_arms})
    arm_logged = sorted({key for arm_id in arm_ids for key in client.get_run(arm_id).data.metrics})
    seed_logged = sorted({key for run in runs.values() for key in run.data.metrics})
    seeds_state = with_x_axis_metric(chart_view_state(run_ids, keys, group_by_tag=ARM_TAG, other_keys=seed_logged), x_axis_metric)
    save_chart_view(client, experiment_id, seeds_view_key(parent_run_id), seeds_state)
    state = with_x_axis_metric(chart_view_state(arm_ids, keys, group_by_tag=None, other_keys=arm_logged), x_axis_metric)
    key = view_key(parent_run_id)
    save_chart_view(client, experiment_id, key, state)
    return chart_view_url(base_url, experiment_id, key)


def with_x_axis_metric(state: dict, metric_key: str | None) -> dict:
    """The view ``state`` with its line charts drawn against ``metric_key`` (None: unchanged).

    MLflow 3.17's line cards take the x-axis ``xAxisKey: "metric"`` with the metric in
    ``selectedXAxisMetricKey`` (the card's X-axis "Metric" choice; read from the UI bundle,
    ``RunsChartsLineCardConfig``); a card with ``useGlobalXaxisKey: false`` keeps its own, and the
    page's global setting (the "Configure charts" menu) gets the same so that the cards the UI
    generates for the other metrics follow it. The UI pairs each point with the x metric's value at
    the same step, so a step without a counter (the step-0 evaluation) is not drawn."""
    if not metric_key:
        return state
    axis = {"xAxisKey": "metric", "selectedXAxisMetricKey": metric_key}
    return {
        **state,
        "compareRunCharts": [{**card, **axis} if card.get("type") == "LINE" else card for card in state["compareRunCharts"]],
        "globalLineChartConfig": {**state["globalLineChartConfig"], **axis},
    }


def _arm_runs(runs: dict, run_arms: dict[str, str]) -> dict[str, list[str]] | None:
    """Arm run id → its seed run ids (in the order given), from the seed runs' parent tag;
    ``None`` when a seed run has no parent, or an arm's seed runs have several."""
    by_parent: dict[str, list[str]] = {}
    for run_id, run in runs.items():
        parent = run.data.tags.get(PARENT_TAG)
        if not parent:
            return None
        by_parent.setdefault(parent, []).append(run_id)
    arms_of = [{run_arms[run_id] for run_id in seed_ids} for seed_ids in by_parent.values()]
    if any(len(arms) != 1 for arms in arms_of) or len({next(iter(arms)) for arms in arms_of}) != len(arms_of):
        return None
    return by_parent


def log_mean_over_seeds(client: MlflowClient, arm_run_id: str, seed_run_ids: list[str], keys: list[str]) -> None:
    """Log on the arm's run, at each step it lacks for a key, the mean of the finite values its
    seed runs logged there (the launcher logs the training metrics' means when the seeds finish;
    the held-out scores are only on the seed runs, and the chart view draws the arm's run)."""
    import numpy as np
    import pandas as pd

    rows = []
    for run_id in seed_run_ids:
        for key in keys:
            last = {m.step: m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)}
            rows += [(key, step, value) for step, value in last.items()]  # a step logged twice counts once, its last value
    frame = pd.DataFrame(rows, columns=["key", "step", "value"])
    means = frame[np.isfinite(frame["value"])].groupby(["key", "step"])["value"].mean()
    have = {(key, m.step) for key in keys for m in client.get_metric_history(arm_run_id, key)}
    now = int(time.time() * 1000)
    batch = [Metric(key, float(value), now, int(step)) for (key, step), value in means.items() if (key, step) not in have]
    for start in range(0, len(batch), MLFLOW_BATCH):
        client.log_batch(arm_run_id, metrics=batch[start : start + MLFLOW_BATCH])


def headline_summary(headline: dict[str, float], arms: list[str], keys: list[str], *, most: int = 2) -> str:
    """One line per headline key (the first ``most`` that were logged), for the top of the parent
    run's description, which the MLflow UI shows before its "Show more":
    ``eval/x/accuracy: grpo 0.41 [0.38, 0.44] · dr_grpo 0.44 [0.40, 0.47]``."""
    from polyrl.analysis.seed_report import metric_name

    def shown(arm: str, key: str) -> str | None:
        base = f"{metric_name(arm)}/{key}"
        if f"{base}/final" not in headline:
            return None
        bounds = f" [{headline[base + '/ci_low']:.3g}, {headline[base + '/ci_high']:.3g}]" if f"{base}/ci_low" in headline else ""
        return f"{arm} {headline[base + '/final']:.3g}{bounds}"

    lines = []
    for key in keys:
        cells = [cell for cell in (shown(arm, key) for arm in arms) if cell]
        if cells:
            lines.append(f"**{key}**: " + " · ".join(cells))
        if len(lines) == most:
            break
    return "  \n".join(lines)


def log_headline_metrics(client: MlflowClient, run_id: str, metrics: dict[str, float]) -> None:
    now = int(time.time() * 1000)
    batch = [Metric(key, value, now, 0) for key, value in sorted(metrics.items())]
    for start in range(0, len(batch), MLFLOW_BATCH):
        client.log_batch(run_id, metrics=batch[start : start + MLFLOW_BATCH])


def run_page_link(experiment_id: str, run_id: str, artifact_path: str = "") -> str:
    """A link inside the MLflow UI (relative: it works on whatever host serves it) to a run's
    page, or to one of its artifacts opened in the artifact viewer."""
    tail = f"/artifacts/{artifact_path}" if artifact_path else ""
    return f"#/experiments/{experiment_id}/runs/{run_id}{tail}?{MODEL_TRAINING_MODE}"


def last_sample_page(client: MlflowClient, run_id: str, folder: str) -> str | None:
    """The newest sample table of a run's ``folder``, the HTML page when there is one."""
    files = [info.path for info in client.list_artifacts(run_id, folder) if not info.is_dir]
    if not files:
        return None
    newest = max(path.rsplit(".", 1)[0] for path in files)
    return f"{newest}.html" if f"{newest}.html" in files else f"{newest}.json"


def seeds_view_link(experiment_id: str, parent_run_id: str) -> str:
    """A link inside the MLflow UI (relative) to the saved view of the seed runs grouped by arm."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={seeds_view_key(parent_run_id)}&compareRunsMode=CHART&{MODEL_TRAINING_MODE}"


def sample_links_note(
    client: MlflowClient, experiment_id: str, arm: str, runs: list[tuple[str, str]], *, seeds_view: str = ""
) -> str:
    """Markdown for an arm run's description: per run that trained (``(label, run id)``) links
    to its last training and eval sample tables; with ``seeds_view``, a link to the seed runs'
    chart view first."""
    lines = [f"**{arm}** (written by `polyrl compare`): the last sample tables, one click away", ""]
    if seeds_view:
        lines[1:1] = ["", f"[The seed runs of every arm, grouped by arm (mean and min–max band)]({seeds_view})"]
    for label, run_id in runs:
        links = []
        for folder, said in SAMPLE_FOLDERS:
            page = last_sample_page(client, run_id, folder)
            if page:
                links.append(f"[{said}: {page.rsplit('/', 1)[-1]}]({run_page_link(experiment_id, run_id, page)})")
        lines.append(f"- [{label}]({run_page_link(experiment_id, run_id)}): " + (" · ".join(links) or "no sample tables logged"))
    return "\n".join(lines)


def annotate_arm_runs(client: MlflowClient, experiment_id: str, arm_runs: dict, seed_runs: dict[str, list]) -> None:
    """Set each arm run's description to :func:`sample_links_note` (its seed runs, or itself)."""
    for arm, run in arm_runs.items():
        seeds = seed_runs.get(arm) or []
        trained = [(f"seed {seed_run.data.tags.get('polyrl.seed', '?')}", seed_run.info.run_id) for seed_run in seeds] or [
            (run.data.tags.get(ARM_TAG, arm), run.info.run_id)
        ]
        parent_run_id = run.data.tags.get(PARENT_TAG)
        seeds_view = seeds_view_link(experiment_id, parent_run_id) if seeds and parent_run_id else ""
        client.set_tag(run.info.run_id, NOTE_TAG, sample_links_note(client, experiment_id, arm, trained, seeds_view=seeds_view))
