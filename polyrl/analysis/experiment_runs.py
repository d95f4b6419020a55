"""An experiment's runs in the tracking store, and which of them count.

The store itself (a local one that does not exist is refused: MLflow would create an empty one
where a mistyped path points), the newest parent run of an experiment and its arm runs, each
arm's seed runs, and the seed runs that count in a comparison: FINISHED and at their planned
``train.steps`` (a seed run that stopped early would have its last value averaged with the
others' final ones). ``polyrl compare``, ``polyrl plan``'s pilot, ``polyrl calibrate`` and the
rounds of ``until_resolved`` all read runs this way.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from mlflow.tracking import MlflowClient

from polyrl.analysis.arm_status import planned_arms
from polyrl.analysis.report_metrics import metric_histories
from polyrl.core.errors import PolyrlError
from polyrl.tracking.mlflow_runs import ARM_TAG, SEED_TAG, find_arm_runs, find_parent_run, find_seed_runs, sqlite_store_path


class CompareError(PolyrlError, RuntimeError):
    pass


def local_store_path(tracking_uri: str) -> Path | None:
    """The file or folder of a local MLflow store (``sqlite:///…``, ``file:…`` or a bare path);
    ``None`` for a server or an in-memory database."""
    if tracking_uri.startswith("sqlite:"):
        return sqlite_store_path(tracking_uri)
    parsed = urlparse(tracking_uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    # A bare path; bare words ("databricks") name other stores, so only what looks like a path.
    if (parsed.scheme == "" or re.fullmatch(r"[A-Za-z]", parsed.scheme)) and ("/" in tracking_uri or "\\" in tracking_uri):
        return Path(tracking_uri)
    return None


def require_existing_store(tracking_uri: str) -> None:
    """Refuse a local store that does not exist: MLflow would silently create an empty one
    (and its folders) where a mistyped path points, and then report no experiment."""
    path = local_store_path(tracking_uri)
    if path is not None and not path.exists():
        raise CompareError(
            f"MLflow store {str(path)!r} (from {tracking_uri}) does not exist; check --tracking-uri or "
            "$MLFLOW_TRACKING_URI (polyrl run writes ./mlflow.db in the folder it runs from)"
        )


def experiment_arm_runs(client: MlflowClient, experiment: str, tracking_uri: str):
    """The experiment's newest parent run and its arm runs by arm name."""
    parent = find_parent_run(client, experiment)
    if parent is None:
        raise CompareError(f"no polyrl experiment named {experiment!r} in {tracking_uri}; run it first (polyrl run …)")
    arm_runs = find_arm_runs(client, parent.info.experiment_id, parent.info.run_id)
    if not arm_runs:
        planned = planned_arms(parent)
        raise CompareError(
            f"experiment {experiment!r} (run {parent.info.run_id}, status {parent.info.status}) has no arm runs yet"
            + (f"; none of its arms ({', '.join(planned)}) has started" if planned else "")
        )
    return parent, {run.data.tags.get(ARM_TAG, run.info.run_name): run for run in arm_runs}


def experiment_arm_run_ids(client: MlflowClient, experiment: str, tracking_uri: str):
    parent, runs = experiment_arm_runs(client, experiment, tracking_uri)
    return parent, {arm: run.info.run_id for arm, run in runs.items()}


def seed_runs_of(client: MlflowClient, parent, arms: dict[str, str]):
    all_seed_runs = {arm: find_seed_runs(client, parent.info.experiment_id, run_id) for arm, run_id in arms.items()}
    seed_runs = {
        arm: {int(run.data.tags.get(SEED_TAG, "0")): run.info.run_id for run in runs}
        for arm, runs in all_seed_runs.items()
        if runs
    }
    return all_seed_runs, seed_runs


# Logged at every training step (the loop's timing), so its last step is how far a seed run got.
STEP_CLOCK = "perf/step_s"


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


def seed_finals(
    client: MlflowClient, seed_runs: dict[str, dict[int, str]], metrics: list[str]
) -> dict[str, dict[str, dict[int, float]]]:
    """metric -> arm -> seed -> the seed run's last logged value, over ``seed_runs`` (arm -> seed
    -> run id; usually the ones :func:`finished_seed_runs` kept); a run that never logged a metric
    is left out of it."""
    out: dict[str, dict[str, dict[int, float]]] = {metric: {arm: {} for arm in seed_runs} for metric in metrics}
    for arm, by_seed in seed_runs.items():
        for seed, run_id in by_seed.items():
            for metric, points in metric_histories(client, run_id, metrics).items():
                out[metric][arm][seed] = points[-1][1]
    return out
