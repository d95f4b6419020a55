"""Links into the MLflow UI: where it is, the chart view of an experiment run (polyrl compare and polyrl ui
print it), and the compare-runs view with chosen runs selected."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, quote, urlparse

from polyrl.tracking.mlflow_runs import is_server_uri


def ui_base_url(tracking_uri: str, *, host: str = "127.0.0.1", port: int = 5000) -> str:
    """Where the MLflow UI of a store is: the server itself, or the ``polyrl ui`` of a local store."""
    return tracking_uri.rstrip("/") if is_server_uri(tracking_uri) else f"http://{host}:{port}"


# MLflow 3's UI keeps a "GenAI | Model training" mode per browser (default GenAI, which hides
# the runs behind a traces overview); the URL parameter sets it for the page it opens.
MODEL_TRAINING_MODE = "workflowType=machine_learning"


def compare_runs_url(base_url: str, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow's compare-runs view with these runs selected (the route the UI's own Compare
    button builds: ``#/compare-runs?runs=[...]&experiments=[...]``, JSON lists, URL-quoted),
    opened in the UI's model-training mode."""
    runs = quote(json.dumps(list(run_ids)), safe="")
    experiments = quote(json.dumps([str(experiment_id)]), safe="")
    return f"{base_url.rstrip('/')}/#/compare-runs?runs={runs}&experiments={experiments}&{MODEL_TRAINING_MODE}"


def experiment_runs_url(base_url: str, experiment_id: str) -> str:
    """The experiment's runs table in model-training mode (not the GenAI overview)."""
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{MODEL_TRAINING_MODE}"


def chart_view_url(base_url: str, experiment_id: str, view_key: str) -> str:
    """The experiment page in chart mode with a saved view (:mod:`polyrl.tracking.chart_view`)
    applied: its runs, grouping and charts."""
    return (
        f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={quote(view_key, safe='')}"
        f"&compareRunsMode=CHART&{MODEL_TRAINING_MODE}"
    )


def run_ids_in_compare_url(url: str) -> list[str]:
    """The run ids a compare-runs URL selects (the inverse of :func:`compare_runs_url`)."""
    fragment = urlparse(url).fragment
    query = fragment.split("?", 1)[1] if "?" in fragment else ""
    return json.loads(parse_qs(query)["runs"][0])
