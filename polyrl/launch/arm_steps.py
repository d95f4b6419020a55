"""The steps of one experiment's MLflow runs and one arm's training, shared by ``polyrl run``
(:mod:`polyrl.launch.runner`) and Ray submission (:mod:`polyrl.launch.ray_submit`,
:mod:`polyrl.launch.ray_workers`): the parent run, an arm's run with its params and resolved config,
and training an arm to a closed run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from polyrl.config.schema import ExperimentConfig, flatten, to_yaml
from polyrl.core.errors import PolyrlError
from polyrl.launch.resume_config import ConfigChange, config_snapshot, describe_changes
from polyrl.tracking.mlflow_runs import ExperimentTracker, RunLogger
from polyrl.trainer.checkpoint import remove_partial_checkpoints


def start_experiment_run(
    tracker: ExperimentTracker,
    name: str,
    *,
    arms: list[str],
    yaml_text: str,
    config_path: str | Path,
    resume_run_id: str | None = None,
    tags: dict[str, Any] | None = None,
    buffer_dir: str | Path | None = None,
    echo: Callable[[str], None] | None = None,
) -> RunLogger:
    """The experiment's MLflow parent run; a new one gets the YAML as an artifact and the arm list."""
    parent = tracker.start_parent(name, resume_run_id=resume_run_id, tags=tags, buffer_dir=buffer_dir, echo=echo)
    if not resume_run_id:
        parent.log_text(yaml_text, "experiment.yaml")
        parent.set_tags({"polyrl.arms": ",".join(arms), "polyrl.config_path": str(config_path)})
    return parent


def start_arm_run(
    tracker: ExperimentTracker,
    parent_run_id: str,
    arm: str,
    config: ExperimentConfig,
    *,
    arm_dir: str | Path,
    resume_run_id: str | None = None,
    tags: dict[str, Any] | None = None,
    echo: Callable[[str], None] | None = None,
    config_changes: list[ConfigChange] | None = None,
    resume_step: int = 0,
    seed: int | None = None,
) -> RunLogger:
    """One arm's child run with its checkpoint folder, flattened params and resolved config.

    A resumed run keeps its params and ``resolved_config.yaml`` (what it was trained with); a
    config change allowed on resume is recorded as a tag and ``resolved_config.resume_step_<n>.yaml``.
    With ``seed`` it is that seed's run under the arm's run (``parent_run_id``).
    """
    logger = tracker.start_arm(
        parent_run_id, arm, resume_run_id=resume_run_id, tags=tags, buffer_dir=arm_dir, echo=echo, seed=seed
    )
    logger.set_tags({"polyrl.checkpoint_dir": str(Path(arm_dir).resolve())})
    if not resume_run_id:
        logger.log_params(flatten(config.model_dump(mode="json")))
        logger.log_text(to_yaml(config), "resolved_config.yaml")
    elif config_changes:
        # MLflow params are immutable: they keep the values the run started with, and this tag
        # says from which step which values changed.
        logger.set_tags(
            {
                f"polyrl.config_change.step_{resume_step:06d}": describe_changes(config_changes)[:5000],
                "polyrl.config_changed": "true",
            }
        )
        logger.log_text(to_yaml(config), f"resolved_config.resume_step_{resume_step:06d}.yaml")
    return logger


def train_arm(
    config: ExperimentConfig,
    *,
    arm: str,
    arm_dir: str | Path,
    logger: RunLogger,
    parent_run_id: str,
    tracking_uri: str,
    resume: bool = False,
    train: Callable[[Any], None] | None = None,
    on_resumed: Callable[[int], None] | None = None,
) -> list[dict[str, float]]:
    """Build the arm's roles, train them and close the MLflow run (FINISHED, FAILED or KILLED).

    ``train(arm)`` runs the loop (default ``arm.loop().run()``; ``polyrl run`` passes its
    progress-bar loop), where ``arm`` is the built :class:`polyrl.trainer.arm.Arm`. Returns the
    per-step metric history. A failure closes the run with the error's message in the
    ``polyrl.error`` tag.
    """
    from polyrl.trainer.build_arm import build_arm  # torch, vLLM: only where an arm trains

    remove_partial_checkpoints(arm_dir)  # a write cut short by a kill; this process owns the folder now
    # Every checkpoint names the run it belongs to (polyrl eval run:<id> checks it) and the
    # config it was trained with (--resume compares it).
    extra = {
        "mlflow_parent_run_id": parent_run_id,
        "mlflow_run_id": logger.run_id,
        "tracking_uri": tracking_uri,
        "config": config_snapshot(config),
    }
    built = None
    try:
        built = build_arm(
            config,
            arm=arm,
            arm_dir=Path(arm_dir),
            logger=logger,
            evaluator=periodic_evaluator(config, arm=arm),
            checkpoint_extra=extra,
            resume=resume,
            teacher_path=resolve_teacher_run(config, tracking_uri=tracking_uri),
        )
        if built.start_state and on_resumed is not None:
            on_resumed(built.start_step)
        (train or (lambda a: a.loop().run()))(built)
    except PolyrlError as error:
        logger.finish_after_error("FAILED", str(error))
        raise
    except KeyboardInterrupt as error:
        logger.finish_after_error("KILLED", f"stopped by {error or 'KeyboardInterrupt'}")
        raise
    except BaseException as error:
        logger.finish_after_error("FAILED", f"{type(error).__name__}: {error}")
        raise
    finally:
        if built is not None:
            built.close()
    logger.finish()
    return built.history


def resolve_teacher_run(config: ExperimentConfig, *, tracking_uri: str | None) -> Path | None:
    """``distill.teacher.run``'s checkpoint exported to a model folder, found as ``polyrl eval --model
    run:<id>[@<step>]`` finds it (polyrl/evals/models.py) in ``tracking_uri``'s store; None without one."""
    teacher = config.distill.teacher if config.distill is not None else None
    if teacher is None or teacher.run is None:
        return None
    from polyrl.config.base import ConfigError
    from polyrl.core.run_refs import RUN_PREFIX
    from polyrl.evals.models import resolve_model
    from polyrl.evals.suite import EvalError

    ref = teacher.run if teacher.run.startswith(RUN_PREFIX) else RUN_PREFIX + teacher.run
    exports = Path(config.model.cache_dir) / "eval-exports" if config.model.cache_dir else None  # else eval's default
    try:
        return resolve_model(ref, tracking_uri=tracking_uri, cache_dir=exports).path
    except EvalError as error:
        raise ConfigError(f"distill.teacher.run: {error}") from None


def periodic_evaluator(config: ExperimentConfig, *, arm: str | None = None):
    """Evaluation every ``eval.every`` steps inside training (the eval harness, if configured);
    ``arm`` names the arm in its per-example rows."""
    if not config.eval.every or not config.eval.suite:
        return None
    from polyrl.evals.periodic import make_periodic_evaluator

    return make_periodic_evaluator(config, arm=arm)


def yaml_text(path: str | Path) -> str:
    return Path(path).read_text()
