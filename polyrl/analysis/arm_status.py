"""Where each arm of an experiment run stands, read back from MLflow: finished, failed (with its
error), stopped, running, or never started.

``polyrl compare`` states this for every arm the experiment planned (the parent run's
``polyrl.arms`` tag, written before any arm starts), so an arm that failed or never ran is
named rather than shown as a row of dashes or left out; only runs that finished feed its
tables, curves and intervals. With seeds, each seed is its own run: an arm's statistics use the
seeds that finished, and the arm's status names those that did not.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyrl.tracking.mlflow_runs import ERROR_TAG, SEED_TAG

# MLflow run status -> what the report calls it.
STATES = {"FINISHED": "finished", "FAILED": "failed", "KILLED": "stopped", "RUNNING": "running", "SCHEDULED": "running"}
NOT_RUN = "not run"
FINISHED = "finished"


@dataclass(frozen=True)
class ArmStatus:
    arm: str
    state: str  # finished, failed, stopped, running or "not run"
    run_id: str | None = None
    error: str | None = None  # the polyrl.error tag of a failed or stopped run (or of its seeds)
    finished_seeds: tuple[int, ...] = ()
    seeds: tuple[int, ...] = ()

    @property
    def finished(self) -> bool:
        return self.state == FINISHED

    def describe(self) -> str:
        text = self.state
        if self.seeds:
            text += f" ({len(self.finished_seeds)} of {len(self.seeds)} seeds finished)"
        if self.error:
            text += f": {self.error}"
        return text


def planned_arms(parent) -> list[str]:
    """The arms the experiment's run set out to train (``polyrl.arms``), in their order."""
    listed = parent.data.tags.get("polyrl.arms", "")
    return [arm for arm in listed.split(",") if arm]


def _run_state(run) -> str:
    return STATES.get(run.info.status, run.info.status.lower())


def arm_status(arm: str, run, seed_runs: list | None = None) -> ArmStatus:
    """The status of one arm from its MLflow run (``None``: never started) and its seed runs."""
    if run is None:
        return ArmStatus(arm, NOT_RUN)
    error = run.data.tags.get(ERROR_TAG)
    if not seed_runs:
        return ArmStatus(arm, _run_state(run), run.info.run_id, error if _run_state(run) != FINISHED else None)
    seeds = tuple(int(seed.data.tags.get(SEED_TAG, "0")) for seed in seed_runs)
    finished = tuple(seed for seed, seed_run in zip(seeds, seed_runs) if _run_state(seed_run) == FINISHED)
    seed_errors = [
        f"seed {seed} {_run_state(seed_run)}" + (f" ({seed_run.data.tags[ERROR_TAG]})" if ERROR_TAG in seed_run.data.tags else "")
        for seed, seed_run in zip(seeds, seed_runs)
        if _run_state(seed_run) != FINISHED
    ]
    state = _run_state(run)
    if state == FINISHED and len(finished) < len(seeds):
        state = "failed"  # an arm run closed by an older polyrl while a seed had not finished
    return ArmStatus(
        arm, state, run.info.run_id, "; ".join(seed_errors) or (error if state != FINISHED else None), finished, seeds
    )


def status_lines(statuses: list[ArmStatus]) -> list[str]:
    """One markdown list line per arm."""
    return [f"- **{s.arm}**: {s.describe()}" + (f" (run `{s.run_id}`)" if s.run_id else "") for s in statuses]


def unfinished_summary(statuses: list[ArmStatus]) -> str | None:
    """One sentence naming the arms that did not finish; ``None`` when all did."""
    unfinished = [s for s in statuses if not s.finished]
    if not unfinished:
        return None
    names = "; ".join(f"{s.arm} ({s.describe()})" for s in unfinished)
    return f"{len(unfinished)} of {len(statuses)} arms did not finish: {names}. The comparison uses only runs that finished"
