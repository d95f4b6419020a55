"""Reaching an MLflow tracking store: its URI, bounded HTTP calls, a probe, the client.

A tracking server is allowed to fail: its HTTP calls get short timeouts and few retries
(:data:`HTTP_DEFAULTS`, unless the environment sets them) and a run checks the server answers
before it starts (:func:`probe_tracking`).
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote

import mlflow
from mlflow.tracking import MlflowClient

from polyrl.core.errors import PolyrlError

# MLflow's own defaults (120 s timeout, 7 retries with exponential backoff) let one call to a
# dead server hang for minutes; three tries of 20 s each bound it, like the short, bounded
# retries of verl's and torchtitan's metric loggers (they drop on failure; we buffer).
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}
PROBE_TIMEOUT_S = 5.0
# MLflow 3's UI opens an experiment on its GenAI "Overview / Traces" page unless the
# experiment says it is model training; this tag (what the UI's own kind selector writes)
# makes it open on the runs table.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


class TrackingUnavailableError(PolyrlError):
    """The MLflow tracking server does not answer; the message says what was kept and how to go on."""

    resumable = True


def resolve_tracking_uri(configured: str | None = None, *, workdir: str | Path | None = None) -> str:
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    folder = Path(workdir or os.getcwd()).resolve()
    return f"sqlite:///{folder / 'mlflow.db'}"


def is_server_uri(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def configure_http_timeouts() -> None:
    """Bound MLflow's HTTP calls (read by MLflow at each request); the user's values win."""
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)


def unreachable_reason(uri: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why a tracking server does not answer, or None when it does (any HTTP reply counts:
    a 401 or 404 is a server that is there). Local stores (SQLite, files) always answer."""
    if not is_server_uri(uri):
        return None
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as error:
        return str(getattr(error.reason, "strerror", None) or error.reason)
    except (OSError, ValueError) as error:  # timeouts, resets, a malformed URI
        return str(error) or type(error).__name__


def probe_tracking(
    uri: str,
    timeout: float = PROBE_TIMEOUT_S,
    *,
    setting: str = "tracking.uri",
    nothing_done: str = "nothing was trained or logged",
) -> None:
    """Raise :class:`TrackingUnavailableError` at once when a tracking server does not answer;
    ``setting`` names where the caller's URI comes from, ``nothing_done`` what was not started."""
    reason = unreachable_reason(uri, timeout)
    if reason is not None:
        raise TrackingUnavailableError(
            f"cannot reach MLflow at {uri}: {reason} (no answer within {timeout:g} s). Start the tracking server "
            f"(e.g. mlflow server --host 127.0.0.1 --port 5000) or point {setting} / MLFLOW_TRACKING_URI at a running one; "
            f"{nothing_done}"
        )


def make_client(tracking_uri: str) -> MlflowClient:
    configure_http_timeouts()
    mlflow.set_tracking_uri(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri)


def sqlite_store_path(tracking_uri: str) -> Path | None:
    """The database file of a SQLite store (SQLAlchemy form: ``sqlite:///relative.db``,
    ``sqlite:////absolute.db``); ``None`` for any other store or an in-memory database."""
    if not tracking_uri.startswith("sqlite:"):
        return None
    path = tracking_uri[len("sqlite:") :].split("?", 1)[0]
    if not path.startswith("///") or path == "///":
        return None
    return Path(unquote(path[3:]))


def artifact_location(tracking_uri: str, experiment_name: str) -> str | None:
    """Where a new experiment of a SQLite store keeps its artifacts: beside the database, in
    ``<database folder>/mlartifacts/<experiment>``. MLflow's own default for a SQLite store is
    ``./mlruns`` of whatever folder the process runs in, which scatters one store's artifacts
    over every folder a command was started from. ``None`` (MLflow decides) for a server,
    which keeps its own artifact root, and for file stores, which keep artifacts inside."""
    database = sqlite_store_path(tracking_uri)
    if database is None:
        return None
    folder = re.sub(r"[^A-Za-z0-9_.\-]+", "_", experiment_name).strip("._") or "experiment"
    return (database.resolve().parent / "mlartifacts" / folder).as_uri()


def ensure_experiment(client: MlflowClient, name: str, *, tracking_uri: str | None = None) -> str:
    """The experiment's id (created or restored), marked as model training for the MLflow UI.
    Created on a SQLite store (``tracking_uri``), it keeps its artifacts beside the database
    (:func:`artifact_location`); an existing experiment keeps the location it was created with."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        location = artifact_location(tracking_uri, name) if tracking_uri else None
        experiment_id = client.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    else:
        experiment_id = experiment.experiment_id
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment_id)
        if EXPERIMENT_KIND_TAG not in experiment.tags:  # a kind the user chose in the UI stays
            client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return experiment_id
