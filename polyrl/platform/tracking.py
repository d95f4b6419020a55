"""MLflow tracking: one parent run per experiment, one child run per arm.

The default store is a SQLite file in the working folder, so a run needs no server; the YAML
or ``MLFLOW_TRACKING_URI`` points anywhere else, a ``mlflow server`` on 127.0.0.1 included.
Runs are addressed by id through :class:`mlflow.MlflowClient` rather than the fluent "active
run" API, so a resumed process can continue the very same runs.
"""

from __future__ import annotations

import json
import numbers
import os
import time
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

EXPERIMENT_TAG = "polyrl.experiment"
ARM_TAG = "polyrl.arm"
ROLE_TAG = "polyrl.role"
# Written last in each step's batch: a step is in MLflow iff this marker is.
STEP_MARKER = "train/step"
MLFLOW_PARAM_VALUE_LIMIT = 6000


def resolve_tracking_uri(configured: str | None = None, *, workdir: str | Path | None = None) -> str:
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    folder = Path(workdir or os.getcwd()).resolve()
    return f"sqlite:///{folder / 'mlflow.db'}"


def make_client(tracking_uri: str) -> MlflowClient:
    mlflow.set_tracking_uri(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri)


def ensure_experiment(client: MlflowClient, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    return client.create_experiment(name)


def is_metric_value(value: Any) -> bool:
    """A real number, NaN and ±inf included: a NaN loss must show in the curve, not leave a gap
    that reads as "not measured". Only non-numbers (None, strings, bools, tensors) are dropped."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class RunLogger:
    """Logs one arm's metrics, params, tags and artifacts to a fixed MLflow run id."""

    def __init__(self, client: MlflowClient, run_id: str):
        self.client = client
        self.run_id = run_id
        self._already_logged_steps: set[int] | None = None

    def log_params(self, params: dict[str, Any]) -> None:
        existing = self.client.get_run(self.run_id).data.params
        batch = []
        for key, value in params.items():
            text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
            text = text[:MLFLOW_PARAM_VALUE_LIMIT]
            if key in existing:
                continue  # params are immutable in MLflow; a resumed run already has them
            batch.append(Param(key, text))
        for start in range(0, len(batch), 100):
            self.client.log_batch(self.run_id, params=batch[start : start + 100])

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def logged_steps(self) -> set[int]:
        if self._already_logged_steps is None:
            history = self.client.get_metric_history(self.run_id, STEP_MARKER)
            self._already_logged_steps = {int(m.step) for m in history}
        return self._already_logged_steps

    def log_step(self, step: int, metrics: dict[str, float]) -> bool:
        """Log one step's metrics atomically; skip a step a killed process already logged.

        Returns False when skipped. A resumed run recomputes the steps after its last
        checkpoint; those that reached MLflow before the kill are not written twice.
        """
        if step in self.logged_steps():
            return False
        timestamp = int(time.time() * 1000)
        entries = [Metric(key, float(value), timestamp, step) for key, value in metrics.items() if is_metric_value(value) and key != STEP_MARKER]
        entries.append(Metric(STEP_MARKER, float(step), timestamp, step))
        # MLflow caps a batch at 1000 metrics; the marker goes in the last chunk.
        for start in range(0, len(entries), 1000):
            self.client.log_batch(self.run_id, metrics=entries[start : start + 1000])
        self._already_logged_steps.add(step)
        return True

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Metrics that are not part of a training step's atomic batch (e.g. periodic eval)."""
        timestamp = int(time.time() * 1000)
        entries = [Metric(key, float(value), timestamp, step) for key, value in metrics.items() if is_metric_value(value)]
        if entries:
            self.client.log_batch(self.run_id, metrics=entries)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        import pandas as pd

        self.client.log_table(self.run_id, data=pd.DataFrame(rows), artifact_file=artifact_file)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


class ExperimentTracker:
    """The parent run of one experiment file and the child runs of its arms."""

    def __init__(self, tracking_uri: str, experiment_name: str):
        self.tracking_uri = tracking_uri
        self.client = make_client(tracking_uri)
        self.experiment_name = experiment_name
        self.experiment_id = ensure_experiment(self.client, experiment_name)

    def start_parent(self, run_name: str, *, resume_run_id: str | None = None, tags: dict[str, Any] | None = None) -> RunLogger:
        if resume_run_id:
            self.client.update_run(resume_run_id, status="RUNNING")
            return RunLogger(self.client, resume_run_id)
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name,
            tags={EXPERIMENT_TAG: self.experiment_name, ROLE_TAG: "experiment", **(tags or {})},
        )
        return RunLogger(self.client, run.info.run_id)

    def start_arm(self, parent_run_id: str, arm: str, *, resume_run_id: str | None = None, tags: dict[str, Any] | None = None) -> RunLogger:
        if resume_run_id:
            self.client.update_run(resume_run_id, status="RUNNING")
            return RunLogger(self.client, resume_run_id)
        run = self.client.create_run(
            self.experiment_id,
            run_name=arm,
            tags={
                "mlflow.parentRunId": parent_run_id,
                EXPERIMENT_TAG: self.experiment_name,
                ARM_TAG: arm,
                ROLE_TAG: "arm",
                **(tags or {}),
            },
        )
        return RunLogger(self.client, run.info.run_id)


def find_parent_run(client: MlflowClient, experiment_name: str):
    """The newest parent run of an experiment (``polyrl compare`` and ``polyrl eval`` use it)."""
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{ROLE_TAG}` = 'experiment'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def find_arm_runs(client: MlflowClient, experiment_id: str, parent_run_id: str):
    return client.search_runs(
        [experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}' and tags.`{ROLE_TAG}` = 'arm'",
        order_by=["attributes.start_time ASC"],
    )

