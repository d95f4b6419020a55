"""What ``polyrl compare`` leaves in the MLflow UI besides the report: the chart view of the arms
(the URL polyrl prints), the headline figures as metrics of the parent run, and on each arm's
run links to its sample pages.

- The chart view (:mod:`polyrl.tracking.chart_view`) shows the runs that trained — the seed
  runs when the experiment has seeds, else the arm runs — grouped by arm when arms have seeds,
  each run in its arm's colour, with the step curves of the held-out scores, the response
  length, reward and training accuracy first.
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
from polyrl.tracking.chart_view import chart_view_state, colour_runs, save_chart_view, view_key
from polyrl.tracking.mlflow_runs import ARM_TAG, NOTE_TAG
from polyrl.tracking.ui_links import MODEL_TRAINING_MODE, chart_view_url

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
) -> str:
    """Save the chart view of these runs on the experiment and return its URL.

    Each run is tagged with its arm's colour (:func:`polyrl.tracking.chart_view.colour_runs`). Runs
    are grouped by arm only when an arm has several (seeds): a group is drawn in a colour the UI
    derives from the group itself (a colour picked in the UI is kept in that browser only), so
    one run per arm is left ungrouped and drawn in its arm's colour."""
    runs = {run_id: client.get_run(run_id) for run_id in run_ids}
    run_arms = {run_id: run.data.tags.get(ARM_TAG, run_id) for run_id, run in runs.items()}
    colour_runs(client, run_arms)
    grouped = grouped and len(set(run_arms.values())) < len(run_arms)
    logged = sorted({key for run in runs.values() for key in run.data.metrics})
    state = chart_view_state(run_ids, headline_keys(eval_keys), group_by_tag=ARM_TAG if grouped else None, other_keys=logged)
    key = view_key(parent_run_id)
    save_chart_view(client, experiment_id, key, state)
    return chart_view_url(base_url, experiment_id, key)


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


def sample_links_note(client: MlflowClient, experiment_id: str, arm: str, runs: list[tuple[str, str]]) -> str:
    """Markdown for an arm run's description: per run that trained (``(label, run id)``) links
    to its last training and eval sample tables."""
    lines = [f"**{arm}** (written by `polyrl compare`): the last sample tables, one click away", ""]
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
        client.set_tag(run.info.run_id, NOTE_TAG, sample_links_note(client, experiment_id, arm, trained))
