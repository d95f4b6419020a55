"""An experiment's units trained side by side (``seeds_at_once`` > 1): the driver's bookkeeping
around :class:`polyrl.launch.units_at_once.SideBySide`.

Units run in schedule order, ``at_once`` at a time. With ``until_resolved`` a round's decision
needs every run of the round, and the round's runs end at different times (an arm that writes
longer answers takes longer): while the round's slowest run finishes, the free slot starts the
**next round's** first run rather than idling. The decision still reads only the rounds so far
(:func:`polyrl.launch.rounds.decide_round` takes the seeds of those rounds), so a run started
ahead changes no decision. When the decision ends the sequence, a run started ahead is stopped
at its next step end with a checkpoint: its MLflow run is KILLED and tagged as outside the
sequence, it is not in ``finished`` nor in its arm's means, and should a ``--resume`` with more
``max_hours`` go on with the sequence, that round trains it on from its checkpoint (the tag goes).
"""

from __future__ import annotations

import signal
from typing import Any, Callable, Iterator

from polyrl.launch.arm_runs import close_arm_run, plain_printer
from polyrl.launch.experiment_folder import STATE_FILE
from polyrl.launch.interrupts import StopNow
from polyrl.launch.logs import LOG_FILE
from polyrl.launch.rounds import OUTSIDE_SEQUENCE_TAG
from polyrl.launch.run_units import RunUnit
from polyrl.launch.units_at_once import SideBySide, UnitJob, UnitOutcome, UnitsFailed, threads_per_unit


class SideBySideRun:
    """Trains an :class:`~polyrl.launch.experiment_run.ExperimentRun`'s schedule side by side."""

    def __init__(self, run: Any):  # the ExperimentRun (typed loosely: it imports this module)
        self.run = run
        self.threads = threads_per_unit(run.at_once)
        self.pool = SideBySide(
            run.at_once,
            threads=self.threads,
            echo=plain_printer(run.console),
            stop=run.stop,
            on_outcome=self.on_outcome,
            fail_fast=run.fail_fast,
        )
        self.units: dict[str, RunUnit] = {}  # every unit started, by key
        self.stopped: list[UnitOutcome] = []  # stopped by a signal (the user's), not by the sequence
        self.failed: list[UnitOutcome] = []
        self.outside: set[str] = set()  # started ahead of a decision that then ended the sequence

    def train(self, schedule: list[list[RunUnit]]) -> None:
        """Every round in order, a decision after each with ``until_resolved``."""
        run = self.run
        try:
            for round_index, round_units in enumerate(schedule):
                jobs = [job for unit in round_units if (job := self.job(unit)) is not None]
                self.announce(jobs)
                self.pool.add(jobs)
                keys = {unit.key for unit in round_units if unit.key in self.units}
                later = schedule[round_index + 1] if run.rounds is not None and round_index + 1 < len(schedule) else []
                self.pool.wait_for(keys, ahead=self.ahead(iter(later)) if later else None)
                self.raise_if_stopped()
                self.close_arms_after(round_units)
                if run.rounds is not None and run.settle_round(round_index, before_closing=self.stop_ahead):
                    break
        except BaseException:
            if self.pool.running:  # a failed decision, a lost store: no unit outlives the command
                self.stop_ahead()
            raise

    def job(self, unit: RunUnit) -> UnitJob | None:
        """Open the unit's MLflow run and say what its process needs; None when there is nothing
        to train (its arm closed, it finished, or it was started ahead already)."""
        run = self.run
        if unit.key in self.units:
            return None
        run_parent = run.enter_unit(unit)
        if run_parent is None:
            return None
        if run.stop.requested is not None:
            raise StopNow(run.stop.requested)
        logger = run.open_unit(unit, run_parent)  # its config holds its train.threads (launch/runner.py)
        self.units[unit.key] = unit
        return UnitJob(
            key=unit.key,
            arm=unit.arm,
            config=unit.config,
            arm_dir=run.folder / unit.key,
            run_id=logger.run_id,
            parent_run_id=run.parent.run_id,
            tracking_uri=run.result.tracking_uri,
            resume=run.resume,
            log_path=run.folder / LOG_FILE,
            verbose=run.verbose,
        )

    def ahead(self, upcoming: Iterator[RunUnit]) -> Callable[[], UnitJob | None]:
        def next_job() -> UnitJob | None:
            for unit in upcoming:
                job = self.job(unit)
                if job is not None:
                    self.run.console.print(
                        f"[cyan]{job.key}[/]: starts now, ahead of this round's decision (a core was free)", highlight=False
                    )
                    return job
            return None

        return next_job

    def announce(self, jobs: list[UnitJob]) -> None:
        if not jobs:
            return
        self.run.where["arm"] = jobs[0].key  # an interrupted message names one unit's checkpoint folder
        self.run.console.print(
            f"{len(jobs)} run(s), {min(self.run.at_once, len(jobs))} at a time, {self.threads} thread(s) each: "
            + ", ".join(job.key for job in jobs),
            highlight=False,
        )

    def on_outcome(self, outcome: UnitOutcome) -> None:
        run, key = self.run, outcome.key
        if outcome.status == "finished":
            run.record_finished(self.units[key], outcome.final_metrics or {})
            run.console.print(f"[cyan]{key}[/]: finished", highlight=False)
        elif outcome.status == "stopped":
            where = f" after step {outcome.step}, checkpoint {outcome.checkpoint}" if outcome.checkpoint else ""
            if key in self.outside:
                run.console.print(
                    f"[cyan]{key}[/]: stopped{where}; started ahead of the decision that ended the sequence, it is not "
                    "part of it (should a --resume with more max_hours go on with the sequence, it continues this run)",
                    highlight=False,
                )
                return
            self.stopped.append(outcome)
            run.console.print(f"[cyan]{key}[/]: stopped{where}", highlight=False)
        else:
            self.failed.append(outcome)
            run.result.failed[key] = outcome.error or "failed"
            run.console.print(
                f"[red]{key}: FAILED[/] ({outcome.error})" + ("" if run.fail_fast else "; the other runs continue"),
                highlight=False,
            )

    def raise_if_stopped(self) -> None:
        if self.stopped:
            first = self.stopped[0]
            self.run.where["arm"] = first.key
            raise StopNow(first.signum or signal.SIGTERM, step=first.step, checkpoint=first.checkpoint)
        if self.failed and self.run.fail_fast:
            first = self.failed[0]
            raise UnitsFailed(f"{first.key}: {first.error} (fail_fast: the other runs were stopped)")
        self.run.where["arm"] = None

    def stop_ahead(self) -> None:
        """Stop every unit still running (started ahead of a decision that ended the sequence), each
        at its next step end with a checkpoint, and tag its run as outside the sequence."""
        keys = self.pool.running_keys()
        if not keys:
            return
        self.outside.update(keys)
        client = self.run.tracker.client
        for key in keys:
            run_id = self.run.state["runs"].get(key)
            if run_id:
                client.set_tag(
                    run_id, OUTSIDE_SEQUENCE_TAG, "started ahead of the decision that ended the sequence; not part of it"
                )
        self.pool.stop_units(keys)

    def close_arms_after(self, units: list[RunUnit]) -> None:
        """Close the arm runs whose last seed was among ``units`` (every seed of theirs has ended)."""
        run = self.run
        if run.seeds is None:
            return
        last = run.seeds[-1]
        for unit in units:
            if unit.seed == last and unit.arm in run.arm_loggers:
                close_arm_run(
                    unit.arm, run.arm_loggers.pop(unit.arm), run.state, run.folder / STATE_FILE, failed=run.result.failed
                )
