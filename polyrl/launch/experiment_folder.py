"""An experiment's folder (``<checkpoint.dir>/<name>/``): its state file (``experiment.json``:
the MLflow run ids, which arms finished, each arm's resolved config), an earlier run moved
aside before a new one, and what a resume may continue (config changes, seeds)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from polyrl.config.schema import ConfigError, ExperimentConfig
from polyrl.launch.logs import LOG_FILE
from polyrl.launch.resume_config import ConfigChange, check_resume_changes, config_snapshot, resume_changes
from polyrl.launch.run_lock import LOCK_FILE
from polyrl.tracking.mlflow_runs import ExperimentTracker
from polyrl.trainer.checkpoint import checkpoint_step, latest_checkpoint, read_checkpoint_info

STATE_FILE = "experiment.json"


def experiment_dir(config: ExperimentConfig) -> Path:
    return Path(config.checkpoint.dir) / config.name


def read_state(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def write_state(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".json.partial")
    staging.write_text(json.dumps(state, indent=2))
    os.replace(staging, path)


def archive_previous_run(folder: Path) -> Path | None:
    """Move an earlier run's files aside (``<name>.previous-<time>``); the lock file and the
    library log (open for appending by this command, one header per command) stay."""
    entries = [p for p in folder.iterdir() if p.name not in (LOCK_FILE, LOG_FILE)] if folder.is_dir() else []
    if not entries:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = folder.with_name(f"{folder.name}.previous-{stamp}")
    count = 1
    while target.exists():
        count += 1
        target = folder.with_name(f"{folder.name}.previous-{stamp}-{count}")
    target.mkdir()
    for entry in entries:
        shutil.move(str(entry), str(target / entry.name))
    return target


def repoint_archived_runs(
    tracker: ExperimentTracker, old_state: dict[str, Any], archived: Path, echo: Callable[[str], None]
) -> None:
    """The earlier run's arm runs now find their checkpoints in the archive folder."""
    if old_state.get("tracking_uri") != tracker.tracking_uri:
        return
    for key, run_id in (old_state.get("runs") or old_state.get("arms", {})).items():
        try:
            tracker.client.set_tag(run_id, "polyrl.checkpoint_dir", str((archived / key).resolve()))
        except Exception as error:  # noqa: BLE001 - a stale tag only costs polyrl eval a search
            echo(f"warning: could not re-point MLflow run {run_id} at its moved checkpoints ({type(error).__name__})")


def resume_plan(
    configs: dict[str, ExperimentConfig], folder: Path, state: dict[str, Any], *, allow: bool, echo: Callable[[str], None]
) -> tuple[dict[str, list[ConfigChange]], dict[str, int]]:
    """Each run's config changes since it was last trained, and the step it resumes after
    (keyed by run key: the arm, or ``arm/seed_<s>``)."""
    changes: dict[str, list[ConfigChange]] = {}
    steps: dict[str, int] = {}
    started = state.get("runs") if state.get("seeds") is not None else state.get("arms", {})
    for arm, config in configs.items():
        if arm not in (started or {}):
            continue  # never started: nothing to compare with
        latest = latest_checkpoint(folder / arm)
        steps[arm] = checkpoint_step(latest) if latest is not None else 0
        baseline = read_checkpoint_info(latest).get("config") if latest is not None else None
        baseline = baseline or state.get("arm_configs", {}).get(arm)
        if baseline is None:
            echo(f"warning: arm {arm!r}: this run predates stored configs; the config cannot be checked against it")
            continue
        changes[arm] = resume_changes(arm, baseline, config_snapshot(config))
    check_resume_changes(changes, finished=set(state.get("finished", [])), allow=allow, resume_steps=steps)
    return changes, steps


def check_seeds_on_resume(state: dict[str, Any], seeds: list[int] | None, name: str) -> None:
    """A resumed run keeps its seeds: a changed set would mix runs of two different plans."""
    if state.get("seeds") != seeds:

        def said(value):
            return "no seeds (one run per arm)" if value is None else f"seeds {value}"

        raise ConfigError(
            f"--resume: the run of {name!r} used {said(state.get('seeds'))}; the config and --seeds now give "
            f"{said(seeds)}. Seeds cannot change on resume: resume with the same seeds, or run without --resume"
        )
