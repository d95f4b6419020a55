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
from typing import NamedTuple

import numpy as np

from polyrl.config.schema import ConfigError, ExperimentConfig, flatten, parse_set_options, read_yaml, resolve_arms
from polyrl.config.seeds import experiment_seeds, seeds_at_once_setting
from polyrl.config.until_resolved import UntilResolvedConfig, until_resolved_plan


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


# Above this many training runs, polyrl run and submit want --many-runs: `seeds: 1000` is more
# often a typo of `seed: 1000` than a plan, and it would start runs for days.
MANY_RUNS = 100


class Plan(NamedTuple):
    """What an experiment file asks to run: each arm's resolved config, the seeds (None: one run
    per arm), the ``until_resolved`` rounds (None without) and ``seeds_at_once`` (``auto`` or a number)."""

    configs: dict[str, ExperimentConfig]
    seeds: list[int] | None
    rounds: UntilResolvedConfig | None
    seeds_at_once: int | str


def load_plan(
    path: str | Path,
    *,
    set_options: list[str] | None = None,
    seeds_option: str | None = None,
    many_runs: bool = True,
    seeds_at_once_option: str | None = None,
) -> Plan:
    """The experiment's :class:`Plan`; with ``until_resolved`` its seeds are the rounds' and
    ``--seeds`` is refused; a plan of more than :data:`MANY_RUNS` runs is refused unless ``many_runs``."""
    raw = read_yaml(path)
    configs = resolve_arms(raw, source=str(path), overrides=parse_set_options(set_options or []))
    seeds = experiment_seeds(raw, source=str(path), option=seeds_option)
    at_once = seeds_at_once_setting(raw, source=str(path), option=seeds_at_once_option)
    rounds = until_resolved_plan(raw, list(configs), source=str(path))
    if rounds is not None:
        if seeds_option is not None:
            raise ConfigError(f"--seeds {seeds_option}: {path} has until_resolved, whose rounds decide the seeds; drop --seeds")
        seeds = rounds.seeds()
    if not many_runs and run_count(configs, seeds) > MANY_RUNS:
        raise ConfigError(
            f"{path}: {plan_line(configs, seeds)}: more than {MANY_RUNS} runs in one command. seeds: N means N runs of "
            "every arm (did you mean seed: N, one run with that seed?); pass --many-runs to start them all"
        )
    return Plan(configs, seeds, rounds, at_once)


def run_count(configs: dict[str, ExperimentConfig], seeds: list[int] | None) -> int:
    return len(configs) * (len(seeds) if seeds is not None else 1)


def plan_line(configs: dict[str, ExperimentConfig], seeds: list[int] | None) -> str:
    """How many training runs and steps an experiment starts, in words."""
    per_arm = len(seeds) if seeds is not None else 1
    steps = per_arm * sum(config.train.steps for config in configs.values())
    if seeds is None:
        return f"{len(configs)} arm(s), one training run each, {steps:,} training steps in all"
    return (
        f"{len(configs)} arm(s) × {per_arm} seed(s) = {run_count(configs, seeds):,} training runs, "
        f"{steps:,} training steps in all"
    )


def start_seeded_arm_run(
    tracker,
    parent_run_id: str,
    arm: str,
    config: ExperimentConfig,
    seeds: list[int],
    folder: Path,
    resume_run_id: str | None,
    echo,
):
    """The arm's run over its seeds: the arm's params (``seeds`` in place of ``seed``), no training of its own."""
    seeds_text = ",".join(map(str, seeds))
    logger = tracker.start_arm(
        parent_run_id, arm, resume_run_id=resume_run_id, buffer_dir=folder, echo=echo, tags={"polyrl.seeds": seeds_text}
    )
    if not resume_run_id:
        params = flatten(config.model_dump(mode="json"))
        params.pop("seed", None)
        logger.log_params(params | {"seeds": seeds_text})
    return logger


def summary_keys() -> list[str]:
    from polyrl.analysis.report_metrics import CURVES, TABLE_METRICS

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
    """Log the per-step mean over seeds of the headline metrics to the arm's run.

    A reopened arm run whose seeds trained longer gets only the steps it lacks (the means of
    the others are unchanged). One that has more seeds than when it closed (an until_resolved
    sequence resumed with more hours) gets every step again: the means over all its seeds are
    then each metric's latest value (MLflow keeps the earlier ones in the history)."""
    client = arm_logger.client
    had = arm_logger.logged_steps()
    earlier_count = client.get_run(arm_logger.run_id).data.metrics.get("seeds/n") if had else None
    more_seeds = earlier_count is not None and earlier_count != float(len(seed_run_ids))
    steps: dict[int, dict[str, float]] = {}
    for key in summary_keys():
        histories = [{m.step: m.value for m in client.get_metric_history(run_id, key)} for run_id in seed_run_ids]
        for step, value in mean_over_seeds(histories).items():
            steps.setdefault(step, {})[key] = value
    for step, metrics in sorted(steps.items()):
        values = metrics | {"seeds/n": float(len(seed_run_ids))}
        if more_seeds:
            arm_logger.log_metrics(step, values)  # log_step would skip a step the run has
        else:
            arm_logger.log_step(step, values)
