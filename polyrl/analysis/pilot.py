"""A finished experiment as a pilot for planning: the per-seed paired differences of one metric.

Reads the newest run of an experiment run with seeds from MLflow, the way ``polyrl compare``
does (:mod:`polyrl.analysis.seed_report`): only seed runs that finished and reached their
``train.steps`` count, each seed's final value is its last logged value of the metric, and the
difference of two arms is paired over the seeds both have. The runs' own durations give the
minutes a run takes.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from polyrl.analysis.experiment_runs import (
    CompareError,
    experiment_arm_run_ids,
    finished_seed_runs,
    require_existing_store,
    seed_finals,
    seed_runs_of,
)
from polyrl.tracking.mlflow_runs import make_client


@dataclass(frozen=True)
class PilotDifferences:
    """``arm_a − arm_b`` of ``metric`` at each seed both arms finished, in seed order."""

    experiment: str
    metric: str
    arm_a: str
    arm_b: str
    arms: list[str]  # every arm of the experiment
    seeds: list[int]
    differences: list[float]
    minutes_per_run: float | None  # the mean wall time of the finished seed runs; None when unknown

    @property
    def sd(self) -> float:
        return statistics.stdev(self.differences) if len(self.differences) >= 2 else math.nan


def pilot_differences(
    experiment: str, *, tracking_uri: str, metric: str, arm_a: str | None = None, arm_b: str | None = None
) -> PilotDifferences:
    """The paired per-seed differences of ``metric`` between two arms of ``experiment`` (both
    named, or the experiment's only two arms). Refuses, naming what there is: an experiment
    without seed runs, an unknown arm or metric, fewer than two shared finished seeds."""
    require_existing_store(tracking_uri)
    client = make_client(tracking_uri)
    parent, arm_runs = experiment_arm_run_ids(client, experiment, tracking_uri)
    arms = list(arm_runs)
    if arm_a is None and arm_b is None:
        if len(arms) != 2:
            raise CompareError(
                f"--arm-a and --arm-b: experiment {experiment!r} has {len(arms)} arms ({', '.join(arms)}); name two"
            )
        arm_a, arm_b = arms
    for option, arm in (("--arm-a", arm_a), ("--arm-b", arm_b)):
        if arm not in arm_runs:
            raise CompareError(f"{option} {arm!r} is not an arm of experiment {experiment!r}; its arms: {', '.join(arms)}")
    if arm_a == arm_b:
        raise CompareError(f"--arm-a and --arm-b are both {arm_a!r}: a comparison needs two arms")
    _, seed_runs = seed_runs_of(client, parent, {arm: arm_runs[arm] for arm in (arm_a, arm_b)})
    if set(seed_runs) != {arm_a, arm_b}:
        raise CompareError(f"experiment {experiment!r} was not run with seeds (no seed runs under {arm_a} and {arm_b})")
    kept, _ = finished_seed_runs(client, seed_runs)
    finals = seed_finals(client, kept, [metric])[metric]
    seeds = sorted(set(finals[arm_a]) & set(finals[arm_b]))
    if len(seeds) < 2:
        logged = sorted(client.get_run(next(iter(kept[arm_a].values()))).data.metrics) if kept[arm_a] else []
        raise CompareError(
            f"{metric!r}: {len(seeds)} finished seed(s) of both {arm_a} and {arm_b} logged it; a standard deviation needs 2"
            + (f" (the metrics logged: {', '.join(logged)})" if logged and not finals[arm_a] else "")
        )
    durations = [
        (run.info.end_time - run.info.start_time) / 60_000
        for by_seed in kept.values()
        for run in (client.get_run(run_id) for run_id in by_seed.values())
        if run.info.end_time and run.info.start_time
    ]
    return PilotDifferences(
        experiment=experiment,
        metric=metric,
        arm_a=arm_a,
        arm_b=arm_b,
        arms=arms,
        seeds=seeds,
        differences=[finals[arm_a][s] - finals[arm_b][s] for s in seeds],
        minutes_per_run=statistics.fmean(durations) if durations else None,
    )
