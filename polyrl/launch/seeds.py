"""Seeds as an axis of an experiment: every arm × seed is one run.

With ``seeds`` (in the YAML or ``--seeds``), MLflow holds the experiment's run, one run per arm
under it and one run per seed under each arm's run (``mlflow.parentRunId``; the UI nests
them); checkpoints go to ``<checkpoint.dir>/<name>/<arm>/seed_<s>/``. Without ``seeds`` a unit
is an arm, as before. The arm's run trains nothing itself: once its seeds are done it gets the
per-step mean over seeds of the headline metrics (so MLflow's compare view of the arm runs
shows one curve per arm) and ``seeds/n``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyrl.config.schema import ExperimentConfig, flatten, load_experiment, read_yaml
from polyrl.config.seeds import experiment_seeds


@dataclass(frozen=True)
class RunUnit:
    """One training run: an arm, and its seed when the experiment has ``seeds``."""

    arm: str
    seed: int | None
    config: ExperimentConfig

    @property
    def key(self) -> str:
        """Names the run in ``experiment.json`` and its folder under the experiment's folder."""
        return self.arm if self.seed is None else f"{self.arm}/seed_{self.seed}"


def expand_units(configs: dict[str, ExperimentConfig], seeds: list[int] | None) -> list[RunUnit]:
    """Arm-major order (all seeds of an arm, then the next arm), so an arm's run closes early."""
    if seeds is None:
        return [RunUnit(arm, None, config) for arm, config in configs.items()]
    return [RunUnit(arm, seed, config.model_copy(update={"seed": seed})) for arm, config in configs.items() for seed in seeds]


def load_plan(path: str | Path, *, set_options: list[str] | None = None, seeds_option: str | None = None
              ) -> tuple[dict[str, ExperimentConfig], list[int] | None]:
    """Each arm's resolved config and the experiment's seeds (None: one run per arm)."""
    configs = load_experiment(path, set_options=set_options)
    return configs, experiment_seeds(read_yaml(path), source=str(path), option=seeds_option)


def start_seeded_arm_run(tracker, parent_run_id: str, arm: str, config: ExperimentConfig, seeds: list[int], folder: Path,
                         resume_run_id: str | None, echo):
    """The arm's run over its seeds: the arm's params (``seeds`` in place of ``seed``), no training of its own."""
    seeds_text = ",".join(map(str, seeds))
    logger = tracker.start_arm(parent_run_id, arm, resume_run_id=resume_run_id, buffer_dir=folder, echo=echo,
                               tags={"polyrl.seeds": seeds_text})
    if not resume_run_id:
        params = flatten(config.model_dump(mode="json"))
        params.pop("seed", None)
        logger.log_params(params | {"seeds": seeds_text})
    return logger


def summary_keys() -> list[str]:
    from polyrl.launch.report_metrics import CURVES, TABLE_METRICS

    return list(dict.fromkeys([key for key, _ in CURVES] + list(TABLE_METRICS)))


def mean_over_seeds(histories: list[dict[int, float]]) -> dict[int, float]:
    """Per step, the mean of the finite values the seeds logged there."""
    by_step: dict[int, list[float]] = {}
    for history in histories:
        for step, value in history.items():
            if np.isfinite(value):
                by_step.setdefault(int(step), []).append(float(value))
    return {step: float(np.mean(values)) for step, values in sorted(by_step.items())}


def log_arm_summary(arm_logger, seed_run_ids: list[str]) -> None:
    """Log the per-step mean over seeds of the headline metrics to the arm's run."""
    client = arm_logger.client
    steps: dict[int, dict[str, float]] = {}
    for key in summary_keys():
        histories = [{m.step: m.value for m in client.get_metric_history(run_id, key)} for run_id in seed_run_ids]
        for step, value in mean_over_seeds(histories).items():
            steps.setdefault(step, {})[key] = value
    for step, metrics in sorted(steps.items()):
        arm_logger.log_step(step, metrics | {"seeds/n": float(len(seed_run_ids))})
