"""The per-example outcome rows of an experiment's runs, read back from MLflow.

Every evaluation leaves ``eval_examples/<suite>/step_<n>.jsonl`` in the run it evaluated
(:mod:`polyrl.evals.example_outcomes`); ``polyrl eval`` of a run's checkpoint leaves
``step_<n>.polyrl-eval.jsonl`` beside them. :func:`run_example_rows` reads one run's,
:func:`experiment_example_rows` every seed run's of an experiment. A row's ``arm`` and ``seed``
are set from the run's tags (the rows carry them too, but a run's tags are what compare groups
by).
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from typing import Any

from mlflow.tracking import MlflowClient

from polyrl.tracking.mlflow_runs import ARM_TAG, SEED_TAG, find_arm_runs, find_parent_run, find_seed_runs

EXAMPLES_FOLDER = "eval_examples"  # as polyrl.evals.example_outcomes writes it (that layer sits above this one's reads)
FILE_NAME = re.compile(r"^step_(\d+)(\.polyrl-eval)?\.jsonl$")


@dataclass(frozen=True)
class ExampleFile:
    path: str  # the artifact path in its run
    suite: str
    step: int
    from_polyrl_eval: bool


def example_files(client: MlflowClient, run_id: str) -> list[ExampleFile]:
    """The per-example artifacts of a run, by suite and step."""
    found = []
    for folder in client.list_artifacts(run_id, EXAMPLES_FOLDER):
        if not folder.is_dir:
            continue
        suite = folder.path.rsplit("/", 1)[-1]
        for info in client.list_artifacts(run_id, folder.path):
            match = FILE_NAME.match(info.path.rsplit("/", 1)[-1])
            if match and not info.is_dir:
                found.append(ExampleFile(info.path, suite, int(match.group(1)), bool(match.group(2))))
    return sorted(found, key=lambda f: (f.suite, f.step, f.from_polyrl_eval))


def final_files(files: list[ExampleFile]) -> list[ExampleFile]:
    """Per suite, the file of the last evaluated step; at the same step a ``polyrl eval`` file
    wins over the periodic one (a deliberate evaluation, often of more examples)."""
    last: dict[str, ExampleFile] = {}
    for file in files:  # sorted by suite, step, then polyrl-eval last
        last[file.suite] = file
    return list(last.values())


def read_rows(client: MlflowClient, run_id: str, path: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        local = client.download_artifacts(run_id, path, folder)
        with open(local, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]


def run_example_rows(
    client: MlflowClient, run_id: str, *, arm: str | None = None, seed: int | None = None, final_only: bool = True
) -> list[dict[str, Any]]:
    """One run's per-example rows (every suite); ``final_only``: only each suite's last
    evaluation (:func:`final_files`). ``arm`` and ``seed`` default to the run's tags (a run
    without a seed tag, a single-seed arm run: the seed its rows say, else 0). Each row gets
    ``suite``, ``file`` and ``run_id``."""
    if arm is None or seed is None:
        tags = client.get_run(run_id).data.tags
        arm = tags.get(ARM_TAG, arm) if arm is None else arm
        seed = int(tags[SEED_TAG]) if seed is None and SEED_TAG in tags else seed
    files = example_files(client, run_id)
    rows = []
    for file in final_files(files) if final_only else files:
        for row in read_rows(client, run_id, file.path):
            own_seed = seed if seed is not None else int(row.get("seed") or 0)
            rows.append({**row, "arm": arm, "seed": own_seed, "suite": file.suite, "file": file.path, "run_id": run_id})
    return rows


def runs_example_rows(
    client: MlflowClient, runs: dict[str, dict[int | None, str]], *, final_only: bool = True
) -> list[dict[str, Any]]:
    """The rows of ``runs`` (arm -> seed -> run id; seed None: as :func:`run_example_rows`
    finds it), each labelled with its arm and seed."""
    return [
        row
        for arm, by_seed in runs.items()
        for seed, run_id in by_seed.items()
        for row in run_example_rows(client, run_id, arm=arm, seed=seed, final_only=final_only)
    ]


def experiment_example_rows(experiment: str, *, tracking_uri: str, final_only: bool = True) -> list[dict[str, Any]]:
    """Every per-example row of the newest run of ``experiment``: its seed runs' (or, without
    seeds, its arm runs'), finished or not. ``final_only=False`` reads every evaluated step."""
    from polyrl.tracking.mlflow_runs import make_client

    client = make_client(tracking_uri)
    parent = find_parent_run(client, experiment)
    if parent is None:
        raise LookupError(f"no polyrl experiment named {experiment!r} in {tracking_uri}")
    runs: dict[str, dict[int, str]] = {}
    for arm_run in find_arm_runs(client, parent.info.experiment_id, parent.info.run_id):
        arm = arm_run.data.tags.get(ARM_TAG, arm_run.info.run_name)
        seeds = find_seed_runs(client, parent.info.experiment_id, arm_run.info.run_id)
        runs[arm] = {int(run.data.tags.get(SEED_TAG, 0)): run.info.run_id for run in seeds} or {None: arm_run.info.run_id}
    return runs_example_rows(client, runs, final_only=final_only)
