"""Run an experiment file: every arm in turn, one MLflow parent run, resumable.

The experiment's folder (``<checkpoint.dir>/<name>/``) holds ``experiment.json`` — the MLflow
run ids and which arms finished — and one checkpoint folder per arm. ``resume=True`` picks up
the same MLflow runs and each unfinished arm's latest checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from polyrl.platform.config import ConfigError, ExperimentConfig, flatten, load_experiment, read_yaml, to_yaml
from polyrl.platform.tracking import ExperimentTracker, RunLogger, resolve_tracking_uri

STATE_FILE = "experiment.json"


@dataclass
class ExperimentResult:
    name: str
    tracking_uri: str
    parent_run_id: str
    arm_run_ids: dict[str, str]
    final_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    experiment_dir: Path | None = None


def experiment_dir(config: ExperimentConfig) -> Path:
    return Path(config.checkpoint.dir) / config.name


def read_state(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def write_state(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".json.partial")
    staging.write_text(json.dumps(state, indent=2))
    os.replace(staging, path)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.fields[arm]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]:>6}  acc {task.fields[accuracy]:>5}  len {task.fields[length]:>5}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


# --- steps shared with polyrl submit (distributed.py) -----------------------------------------


def start_experiment_run(tracker: ExperimentTracker, name: str, *, arms: list[str], yaml_text: str, config_path: str | Path,
                         resume_run_id: str | None = None, tags: dict[str, Any] | None = None) -> RunLogger:
    """The experiment's MLflow parent run; a new one gets the YAML as an artifact and the arm list."""
    parent = tracker.start_parent(name, resume_run_id=resume_run_id, tags=tags)
    if not resume_run_id:
        parent.log_text(yaml_text, "experiment.yaml")
        parent.set_tags({"polyrl.arms": ",".join(arms), "polyrl.config_path": str(config_path)})
    return parent


def start_arm_run(tracker: ExperimentTracker, parent_run_id: str, arm: str, config: ExperimentConfig, *, arm_dir: str | Path,
                  resume_run_id: str | None = None, tags: dict[str, Any] | None = None) -> RunLogger:
    """One arm's child run with its checkpoint folder, flattened params and resolved config."""
    logger = tracker.start_arm(parent_run_id, arm, resume_run_id=resume_run_id, tags=tags)
    logger.set_tags({"polyrl.checkpoint_dir": str(Path(arm_dir).resolve())})
    logger.log_params(flatten(config.model_dump(mode="json")))
    logger.log_text(to_yaml(config), "resolved_config.yaml")
    return logger


def train_arm(config: ExperimentConfig, *, arm: str, arm_dir: str | Path, logger: RunLogger, parent_run_id: str, tracking_uri: str,
              resume: bool = False, train: Callable[[Any], None] | None = None,
              on_resumed: Callable[[int], None] | None = None) -> list[dict[str, float]]:
    """Build the arm's trainer, train it and close the MLflow run (FINISHED, FAILED or KILLED).

    ``train(trainer)`` runs the loop (default ``trainer.run()``; ``polyrl run`` passes its
    progress-bar loop). Returns the per-step metric history.
    """
    from polyrl.platform.trainer import ArmTrainer  # torch, vLLM: only where an arm trains

    trainer = ArmTrainer(config, arm=arm, arm_dir=Path(arm_dir), logger=logger, evaluator=periodic_evaluator(config))
    trainer.checkpoint_extra = {"mlflow_parent_run_id": parent_run_id, "mlflow_run_id": logger.run_id, "tracking_uri": tracking_uri}
    try:
        start_state = trainer.setup(resume=resume)
        if start_state and on_resumed is not None:
            on_resumed(int(start_state["step"]))
        (train or (lambda t: t.run()))(trainer)
    except BaseException as error:
        logger.finish("KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
        raise
    finally:
        trainer.close()
    logger.finish()
    return trainer.history


def run_experiment(
    path: str | Path,
    *,
    set_options: list[str] | None = None,
    resume: bool = False,
    only_arms: list[str] | None = None,
    console: Console | None = None,
    show_progress: bool | None = None,
) -> ExperimentResult:

    console = console or Console()
    configs = load_experiment(path, set_options=set_options)
    if only_arms:
        unknown = sorted(set(only_arms) - set(configs))
        if unknown:
            raise ConfigError(f"--arm {unknown}: no such arm; allowed: {', '.join(configs)}")
        configs = {name: cfg for name, cfg in configs.items() if name in only_arms}
    first = next(iter(configs.values()))
    folder = experiment_dir(first)
    state_path = folder / STATE_FILE
    state = read_state(state_path)
    if resume and not state:
        raise ConfigError(f"--resume: no earlier run of {first.name!r} in {folder} (no {STATE_FILE}); run without --resume")
    if not resume and folder.exists():
        # A new run never overwrites an earlier one's checkpoints: keep them beside it.
        shutil.move(str(folder), str(folder.with_name(f"{folder.name}.previous-{time.strftime('%Y%m%d-%H%M%S')}")))
        state = {}
    tracking_uri = state.get("tracking_uri") or resolve_tracking_uri(first.tracking.uri)
    tracker = ExperimentTracker(tracking_uri, first.tracking.experiment or first.name)
    parent = start_experiment_run(tracker, first.name, arms=list(configs), yaml_text=yaml_text(path), config_path=path,
                                  resume_run_id=state.get("parent_run_id"))
    state.setdefault("arms", {})
    state.setdefault("finished", [])
    state.update(tracking_uri=tracking_uri, parent_run_id=parent.run_id, experiment=first.name, config_path=str(path))
    write_state(state_path, state)
    show_progress = first.tracking.progress if show_progress is None else show_progress
    result = ExperimentResult(first.name, tracking_uri, parent.run_id, {}, experiment_dir=folder)
    console.print(f"[bold]polyrl[/] experiment [cyan]{first.name}[/] · arms: {', '.join(configs)} · MLflow: {tracking_uri}")
    try:
        for arm, config in configs.items():
            if arm in state["finished"]:
                console.print(f"arm [cyan]{arm}[/] already finished; skipping")
                result.arm_run_ids[arm] = state["arms"][arm]
                continue
            logger = start_arm_run(tracker, parent.run_id, arm, config, arm_dir=folder / arm, resume_run_id=state["arms"].get(arm))
            state["arms"][arm] = logger.run_id
            write_state(state_path, state)
            result.arm_run_ids[arm] = logger.run_id
            history = train_arm(config, arm=arm, arm_dir=folder / arm, logger=logger, parent_run_id=parent.run_id,
                                tracking_uri=tracking_uri, resume=resume,
                                train=lambda trainer: _train_with_progress(trainer, console, show_progress),
                                on_resumed=lambda step, arm=arm: console.print(f"arm [cyan]{arm}[/]: resumed from step {step}"))
            result.final_metrics[arm] = history[-1] if history else {}
            state["finished"].append(arm)
            write_state(state_path, state)
    except BaseException:
        parent.finish("FAILED")
        raise
    parent.finish()
    return result


def _train_with_progress(trainer: Any, console: Console, show: bool) -> None:
    total = trainer.config.train.steps
    if not show:
        trainer.run()
        return
    with _progress(console) as progress:
        task = progress.add_task("train", total=total, completed=trainer.step_index, arm=trainer.arm, reward="-", accuracy="-", length="-")

        def on_step(step: int, metrics: dict[str, float]) -> None:
            progress.update(
                task,
                completed=step,
                reward=f"{metrics.get('reward/mean', float('nan')):.3f}",
                accuracy=f"{metrics.get('train/accuracy', float('nan')):.2f}",
                length=f"{metrics.get('rollout/response_length/mean', float('nan')):.1f}",
            )

        trainer.on_step = on_step
        trainer.health_printer = progress.console.print
        trainer.run()


def periodic_evaluator(config: ExperimentConfig):
    """Evaluation every ``eval.every`` steps inside training (the eval harness, if configured)."""
    if not config.eval.every or not config.eval.suite:
        return None
    from polyrl.evals.periodic import make_periodic_evaluator

    return make_periodic_evaluator(config)


def yaml_text(path: str | Path) -> str:
    return Path(path).read_text()


def validate_file(path: str | Path, set_options: list[str] | None = None) -> dict[str, ExperimentConfig]:
    """Resolve and validate every arm; also checks that reward modules resolve."""
    from polyrl.rewards import load_reward_class

    configs = load_experiment(path, set_options=set_options)
    for arm, config in configs.items():
        for index, spec in enumerate(config.rewards):
            try:
                load_reward_class(spec.module)
            except Exception as error:  # noqa: BLE001 - reported as a config error with its path
                raise ConfigError(f"{path}: invalid experiment config\n  - rewards[{index}].module (arm {arm!r}): {error}") from None
    return configs


__all__ = ["run_experiment", "validate_file", "ExperimentResult", "read_yaml"]
