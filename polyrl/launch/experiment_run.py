"""One ``polyrl run`` in progress, once its folder, state and MLflow parent run are set up
(:mod:`polyrl.launch.runner`): the units it trains in order (arm × seed, in rounds with
``until_resolved``), the bookkeeping in ``experiment.json`` after each, the arm runs open in
this process, and how the run ends (finished, failed arms named, or killed with every open run
marked).

Arms are independent: an arm that fails is recorded and the next one starts, unless
``fail_fast``; once all have run, :class:`~polyrl.launch.arm_runs.ArmFailedError` names every
failed arm.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from polyrl.config.schema import ExperimentConfig
from polyrl.config.until_resolved import UntilResolvedConfig
from polyrl.core.errors import PolyrlError
from polyrl.launch.arm_runs import (
    ExperimentResult,
    arm_error_text,
    arms_failed,
    close_arm_run,
    last_logged_metrics,
    train_with_progress,
)
from polyrl.launch.arm_steps import start_arm_run, train_arm
from polyrl.launch.experiment_folder import STATE_FILE, write_state
from polyrl.launch.interrupts import StopNow, StopSignals
from polyrl.launch.resume_config import ConfigChange, config_snapshot, describe_changes, schedule_note, steps_change
from polyrl.launch.rounds import OUTSIDE_SEQUENCE_TAG, TrainingClock, decide_round, record_round
from polyrl.launch.run_units import RunUnit, start_seeded_arm_run
from polyrl.launch.side_by_side import SideBySideRun
from polyrl.tracking.mlflow_runs import ExperimentTracker, RunLogger, TrackingUnavailableError

__all__ = ["ExperimentRun"]


@dataclass
class ExperimentRun:
    """The run's collaborators and bookkeeping, shared by every unit it trains."""

    configs: dict[str, ExperimentConfig]
    seeds: list[int] | None
    folder: Path
    state: dict[str, Any]  # experiment.json, written after every change
    tracker: ExperimentTracker
    parent: RunLogger
    result: ExperimentResult
    changes: dict[str, list[ConfigChange]]  # --allow-config-change: per unit, what changed since it trained
    resume_steps: dict[str, int]
    resume: bool
    console: Console
    show_progress: bool
    stop: StopSignals
    where: dict[str, Any]  # the unit training now, for the interrupted message
    fail_fast: bool
    units: int  # how many units the run has: with one, its error is the run's, as it was
    rounds: UntilResolvedConfig | None = None
    clock: TrainingClock | None = None  # with rounds: the training time across processes
    at_once: int = 1  # units trained side by side (seeds_at_once), each in a process of its own
    verbose: bool = False  # the units' own library logs go to the terminal too (polyrl run --verbose)
    arm_loggers: dict[str, RunLogger] = field(default_factory=dict)  # with seeds: the arm runs open in this process

    def save(self) -> None:
        write_state(self.folder / STATE_FILE, self.state)

    def run(self, schedule: list[list[RunUnit]]) -> ExperimentResult:
        """Train every unit of every round in order (a round's decision may end the run early);
        close the parent run FINISHED, or raise naming the failed arms."""
        try:
            if self.at_once > 1:
                SideBySideRun(self).train(schedule)  # each unit in a process of its own
            else:
                for round_index, round_units in enumerate(schedule):
                    for unit in round_units:
                        self.run_unit(unit)
                    if self.rounds is not None and self.settle_round(round_index):
                        break
        except TrackingUnavailableError:
            raise  # the parent run cannot be reached to be closed; a resume closes it
        except BaseException as error:
            killed = isinstance(error, KeyboardInterrupt)
            arm = self.where["arm"]
            message = f"arm {arm!r}: {error}" if arm and isinstance(error, PolyrlError) else None
            for arm_logger in self.arm_loggers.values():
                arm_logger.finish_after_error("KILLED" if killed else "FAILED", message)
            self.parent.finish_after_error("KILLED" if killed else "FAILED", message)
            raise
        if self.result.failed:
            raise arms_failed(self.result, self.parent, self.units)
        self.parent.finish()
        return self.result

    def enter_unit(self, unit: RunUnit) -> str | None:
        """The MLflow run a unit's run goes under (its arm's run with seeds, opened on its first
        seed), or None when there is nothing to train: its arm closed, or the unit finished."""
        key, arm, state, result = unit.key, unit.arm, self.state, self.result
        run_parent = self.parent.run_id
        if self.seeds is not None:
            if arm in state["arms_finished"]:
                result.arm_run_ids[arm] = state["arms"][arm]
                self.record_run_id(unit)
                return None
            if arm not in self.arm_loggers:
                self.arm_loggers[arm] = start_seeded_arm_run(
                    self.tracker, self.parent.run_id, arm, self.configs[arm], self.seeds, self.folder,
                    state["arms"].get(arm), self.console.print,
                )  # fmt: skip
                state["arms"][arm] = self.arm_loggers[arm].run_id
                self.save()
            run_parent = self.arm_loggers[arm].run_id
            result.arm_run_ids[arm] = run_parent
        if key in state["finished"]:
            self.console.print(f"[cyan]{key}[/] already finished; skipping")
            self.record_run_id(unit)
            return None
        return run_parent

    def run_unit(self, unit: RunUnit) -> None:
        """One arm × seed: skipped when finished (or its arm closed), else trained; a failure is
        recorded and the run goes on. The arm's run closes after its last seed."""
        key, arm, state, result = unit.key, unit.arm, self.state, self.result
        run_parent = self.enter_unit(unit)
        if run_parent is not None:
            if self.stop.requested is not None:
                raise StopNow(self.stop.requested)
            self.where["arm"] = key
            try:
                self.train_unit(unit, run_parent)
            except TrackingUnavailableError:
                raise  # the store is away for every arm alike
            except Exception as error:  # noqa: BLE001 - arms are independent: record it, run the next one
                if self.fail_fast or self.units == 1:
                    raise  # nothing else to run: the arm's own error, as it was
                result.failed[key] = arm_error_text(error)
                self.record_run_id(unit)
                logging.getLogger("polyrl.run").info("arm %r failed", key, exc_info=error)  # the traceback: to the log file only
                self.console.print(f"[red]{key}: FAILED[/] ({result.failed[key]}); the other arms continue", highlight=False)
            self.where["arm"] = None
        if self.seeds is not None and unit.seed == self.seeds[-1] and arm in self.arm_loggers:  # not: closed before
            close_arm_run(arm, self.arm_loggers.pop(arm), state, self.folder / STATE_FILE, failed=result.failed)

    def train_unit(self, unit: RunUnit, run_parent: str) -> None:
        """Start (or reopen) one arm × seed run, train it to the end and record it as finished."""
        logger = self.open_unit(unit, run_parent)
        key, console = unit.key, self.console
        history = train_arm(
            unit.config,
            arm=unit.arm,
            arm_dir=self.folder / key,
            logger=logger,
            parent_run_id=self.parent.run_id,
            tracking_uri=self.result.tracking_uri,
            resume=self.resume,
            train=lambda trainer: train_with_progress(trainer, console, self.show_progress, self.stop),
            on_resumed=lambda step: console.print(f"[cyan]{key}[/]: resumed from step {step}"),
        )
        # A resume that trained no step (the run had reached its last step) reports what it logged last.
        self.record_finished(unit, history[-1] if history else last_logged_metrics(self.tracker.client, logger.run_id))

    def record_finished(self, unit: RunUnit, final_metrics: dict[str, float]) -> None:
        self.result.final_metrics[unit.key] = final_metrics
        self.state["finished"].append(unit.key)
        self.save()

    def open_unit(self, unit: RunUnit, run_parent: str) -> RunLogger:
        """Start (or reopen) one unit's MLflow run, with its config changes on a resume, and record it."""
        key, console, state = unit.key, self.console, self.state
        unit_changes = self.changes.get(key) or []
        run_ids = state["arms"] if unit.seed is None else state["runs"]
        at = self.resume_steps.get(key, 0)
        logger = start_arm_run(
            self.tracker, run_parent, unit.arm, unit.config, arm_dir=self.folder / key, resume_run_id=run_ids.get(key),
            echo=console.print, config_changes=unit_changes, resume_step=at, seed=unit.seed,
        )  # fmt: skip
        if unit_changes:
            console.print(
                f"[cyan]{key}[/]: applying config changes from step {at + 1}: {describe_changes(unit_changes)}", highlight=False
            )
            if (steps := steps_change(unit_changes)) is not None and isinstance(steps.old, int):
                note = schedule_note(unit.config, steps.old, at)
                console.print(f"[cyan]{key}[/]: {note}", highlight=False)
                logger.set_tags({f"polyrl.schedule_change.step_{at:06d}": note})
        reopened = run_ids.get(key) == logger.run_id  # only a reopened run can carry the tag: no read for a new one
        if reopened and OUTSIDE_SEQUENCE_TAG in self.tracker.client.get_run(logger.run_id).data.tags:
            self.tracker.client.delete_tag(logger.run_id, OUTSIDE_SEQUENCE_TAG)  # trained on now as a round of it
        run_ids[key] = logger.run_id
        state["arm_configs"][key] = config_snapshot(unit.config)
        self.save()
        self.record_run_id(unit)
        return logger

    def settle_round(self, round_index: int, before_closing: Callable[[], None] | None = None) -> bool:
        """After round ``round_index``: every comparison's decision, recorded; True when no round
        follows (every comparison decided, the hours spent, or the seed budget reached). Open arm
        runs close then, over the seeds they ran, after ``before_closing()`` (side by side: stop
        the runs started ahead of this decision)."""
        rounds, clock, console = self.rounds, self.clock, self.console
        assert rounds is not None and clock is not None
        seeds_so_far = [seed for r in rounds.rounds()[: round_index + 1] for seed in r]
        outcome = decide_round(self.tracker.client, self.state, rounds, seeds_so_far)
        clock.save(self.state)
        record_round(self.state, self.parent, outcome, clock.elapsed())
        self.save()
        for sentence in outcome.sentences:
            console.print(f"[bold]round {round_index + 1}[/] ({len(seeds_so_far)} seeds): {sentence}", highlight=False)
        over_time = rounds.max_hours is not None and clock.elapsed() >= rounds.max_hours * 3600
        last = round_index + 1 == len(rounds.rounds())
        if not (outcome.settled or over_time or last):
            return False
        why = (
            "every comparison is decided"
            if outcome.settled
            else f"the budget of {rounds.max_hours} h is spent"
            if over_time
            else "the seed budget is spent"
        )
        console.print(f"until resolved: {why}; {len(seeds_so_far)} of {rounds.max_seeds} seeds run", highlight=False)
        if before_closing is not None:
            before_closing()
        for arm in list(self.arm_loggers):
            close_arm_run(arm, self.arm_loggers.pop(arm), self.state, self.folder / STATE_FILE, failed=self.result.failed)
        return True

    def record_run_id(self, unit: RunUnit) -> None:
        if unit.seed is None:
            self.result.arm_run_ids[unit.arm] = self.state["arms"][unit.arm]
        else:
            self.result.seed_run_ids[unit.key] = self.state["runs"][unit.key]
