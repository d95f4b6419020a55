"""MLflow tracking: one parent run per experiment, one child run per arm (and per seed).

The default store is a SQLite file in the working folder, so a run needs no server; the YAML
or ``MLFLOW_TRACKING_URI`` points anywhere else, a ``mlflow server`` on 127.0.0.1 included.
Runs are addressed by id through :class:`mlflow.MlflowClient` rather than the fluent "active
run" API, so a resumed process can continue the very same runs.

Reaching the store (bounded HTTP calls, the probe) is :mod:`polyrl.tracking.connection`;
logging to one run, with the disk buffer that waits out an outage, is
:mod:`polyrl.tracking.run_logger`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

# Connection and run logging live in their own modules; their names are importable from here
# too (the tracking package's one public module).
from polyrl.tracking.connection import (  # noqa: F401 - re-exported
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    HTTP_DEFAULTS,
    PROBE_TIMEOUT_S,
    TrackingUnavailableError,
    artifact_location,
    configure_http_timeouts,
    ensure_experiment,
    is_server_uri,
    make_client,
    probe_tracking,
    resolve_tracking_uri,
    sqlite_store_path,
    unreachable_reason,
)
from polyrl.tracking.run_logger import (  # noqa: F401 - re-exported
    BUFFER_PREFIX,
    DEFAULT_RETRY_S,
    ERROR_TAG,
    MLFLOW_PARAM_VALUE_LIMIT,
    RETRY_ENV,
    STEP_MARKER,
    DiskBuffer,
    RunLogger,
    is_metric_value,
)

EXPERIMENT_TAG = "polyrl.experiment"
ARM_TAG = "polyrl.arm"
ROLE_TAG = "polyrl.role"
SEED_TAG = "polyrl.seed"
SEEDS_TAG = "polyrl.seeds"
# A run's description in the MLflow UI.
NOTE_TAG = "mlflow.note.content"


class ExperimentTracker:
    """The parent run of one experiment file and the child runs of its arms.

    A tracking server that does not answer is reported at once (:func:`probe_tracking`), before
    anything heavy starts; ``buffer_dir`` of a run is where its calls wait out an outage.
    """

    def __init__(self, tracking_uri: str, experiment_name: str):
        self.tracking_uri = tracking_uri
        probe_tracking(tracking_uri)
        self.client = make_client(tracking_uri)
        self.experiment_name = experiment_name
        self.experiment_id = self._call(
            lambda: ensure_experiment(self.client, experiment_name, tracking_uri=tracking_uri), "open the experiment"
        )

    def _call(self, call: Callable[[], Any], what: str) -> Any:
        """Run a call the run cannot start without; an unreachable server is one clear error."""
        import requests

        try:
            return call()
        except (MlflowException, requests.RequestException, OSError):
            reason = unreachable_reason(self.tracking_uri)
            if reason is None:
                raise
            raise TrackingUnavailableError(f"cannot reach MLflow at {self.tracking_uri} to {what}: {reason}") from None

    def _logger(self, run_id: str, buffer_dir: str | Path | None, echo: Callable[[str], None] | None) -> RunLogger:
        logger = RunLogger(self.client, run_id, buffer_dir=buffer_dir, echo=echo)
        if logger.buffer is not None and logger.buffer.count:
            logger.flush()  # calls kept by an earlier process of this run go first
        return logger

    def start_parent(
        self,
        run_name: str,
        *,
        resume_run_id: str | None = None,
        tags: dict[str, Any] | None = None,
        buffer_dir: str | Path | None = None,
        echo: Callable[[str], None] | None = None,
    ) -> RunLogger:
        if resume_run_id:
            self._call(lambda: self.client.update_run(resume_run_id, status="RUNNING"), "reopen the experiment's run")
            return self._logger(resume_run_id, buffer_dir, echo)
        run = self._call(
            lambda: self.client.create_run(
                self.experiment_id,
                run_name=run_name,
                tags={EXPERIMENT_TAG: self.experiment_name, ROLE_TAG: "experiment", **(tags or {})},
            ),
            "create the experiment's run",
        )
        return self._logger(run.info.run_id, buffer_dir, echo)

    def start_arm(
        self,
        parent_run_id: str,
        arm: str,
        *,
        resume_run_id: str | None = None,
        tags: dict[str, Any] | None = None,
        buffer_dir: str | Path | None = None,
        echo: Callable[[str], None] | None = None,
        seed: int | None = None,
    ) -> RunLogger:
        """An arm's run under the experiment's run; with ``seed``, one seed's run under the arm's run
        (``parent_run_id`` is then the arm's run)."""
        what = f"arm {arm!r}" + (f" seed {seed}" if seed is not None else "")
        if resume_run_id:
            self._call(lambda: self.client.update_run(resume_run_id, status="RUNNING"), f"reopen the run of {what}")
            return self._logger(resume_run_id, buffer_dir, echo)
        role = {ROLE_TAG: "arm"} if seed is None else {ROLE_TAG: "seed", SEED_TAG: str(seed)}
        run = self._call(
            lambda: self.client.create_run(
                self.experiment_id,
                run_name=arm if seed is None else seed_run_name(arm, seed),
                tags={
                    "mlflow.parentRunId": parent_run_id,
                    EXPERIMENT_TAG: self.experiment_name,
                    ARM_TAG: arm,
                    **role,
                    **(tags or {}),
                },
            ),
            f"create the run of {what}",
        )
        return self._logger(run.info.run_id, buffer_dir, echo)


def seed_run_name(arm: str, seed: int) -> str:
    return f"{arm} · seed {seed}"


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


def find_seed_runs(client: MlflowClient, experiment_id: str, arm_run_id: str):
    """The seed runs under an arm's run (none for an experiment run without ``seeds``), by seed."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{arm_run_id}' and tags.`{ROLE_TAG}` = 'seed'",
    )
    return sorted(runs, key=lambda run: int(run.data.tags.get(SEED_TAG, "0")))
