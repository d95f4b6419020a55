"""How ``polyrl run`` drives one arm's loop and what its arms end with.

The loop with a progress bar and stop requests honoured at step ends; the arm's run over seeds
closed once its seeds have run; the failed arms named together at the end (the others ran:
arms are independent); a finished arm reopened to train longer; and the last logged values of a
run that had no step left to train.
"""

from __future__ import annotations

import functools
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from polyrl.config.schema import ExperimentConfig
from polyrl.core.errors import PolyrlError
from polyrl.launch.experiment_folder import write_state
from polyrl.launch.interrupts import StopNow, StopSignals
from polyrl.launch.resume_config import ConfigChange
from polyrl.tracking.mlflow_runs import RunLogger
from polyrl.trainer.checkpoint import checkpoint_step, latest_checkpoint


@dataclass
class ExperimentResult:
    name: str
    tracking_uri: str
    parent_run_id: str
    arm_run_ids: dict[str, str]
    final_metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # by run key: arm, or arm/seed_<s>
    experiment_dir: Path | None = None
    seeds: list[int] | None = None
    seed_run_ids: dict[str, str] = field(default_factory=dict)  # arm/seed_<s> -> run id
    failed: dict[str, str] = field(default_factory=dict)  # run key -> the error that ended it


class ArmFailedError(PolyrlError, RuntimeError):
    """One or more arms failed (the others ran); the message names each with its error.
    ``result`` holds what the arms that finished logged."""

    exit_code = 1

    def __init__(self, message: str, result: ExperimentResult | None = None):
        super().__init__(message)
        self.result = result


def plain_printer(console: Console):
    """Print lines as they are: health lines start with '[arm]', which rich reads as markup and
    drops; and whole: without a terminal rich would fold them at 80 columns, mid-figure, in a log
    file that is read (and grepped) a line at a time."""
    return functools.partial(console.print, markup=False, highlight=False, soft_wrap=True)


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


# A library's error can run to pages (transformers lists ~200 model configs when a folder is not a
# causal LM); the console line stays readable and the log file keeps the traceback whole.
ERROR_TEXT_CHARS = 600


def arm_error_text(error: BaseException) -> str:
    """What ended an arm, in one line: a polyrl error's message, else the exception's type and message,
    cut at ``ERROR_TEXT_CHARS`` characters."""
    if isinstance(error, PolyrlError):
        text = str(error)
    else:
        body = str(error).strip()
        text = f"{type(error).__name__}: {body.splitlines()[-1]}" if body else type(error).__name__
    if len(text) > ERROR_TEXT_CHARS:
        text = text[:ERROR_TEXT_CHARS] + f"… [{len(text) - ERROR_TEXT_CHARS} more characters: the whole error is in the log file]"
    return text


def arms_failed(result: Any, parent: RunLogger, total: int) -> ArmFailedError:
    """Close the parent run FAILED and name every failed arm with its error and MLflow run."""
    lines = [
        f"  - {key!r} (MLflow run {result.seed_run_ids.get(key) or result.arm_run_ids.get(key)}): {message}"
        for key, message in result.failed.items()
    ]
    summary = f"{len(result.failed)} of {total} {'runs' if result.seeds is not None else 'arms'} failed"
    parent.finish_after_error("FAILED", summary + ": " + ", ".join(result.failed))
    error = ArmFailedError(
        f"{summary} (the others ran to their end):\n"
        + "\n".join(lines)
        + "\nEach one's MLflow run is FAILED with its error; the traceback is in the log file. "
        "Once fixed, --resume trains only the failed ones.",
        result,
    )
    error.resumable = True  # polyrl run adds the exact command
    return error


def reopen_extended_arms(
    state: dict[str, Any],
    changes: dict[str, list[ConfigChange]],
    resume_steps: dict[str, int],
    configs: dict[str, ExperimentConfig],
    console: Console,
) -> None:
    """A finished run whose ``train.steps`` grew (the only change a finished run may take,
    :func:`polyrl.launch.resume_config.check_resume_changes`) trains on from its last checkpoint."""
    for key, found in changes.items():
        if found and key in state.get("finished", []):
            state["finished"].remove(key)
            arm = key.split("/seed_")[0]
            if arm in state.get("arms_finished", []):
                state["arms_finished"].remove(arm)  # its run over seeds reopens and gets the new steps' means
            console.print(
                f"[cyan]{key}[/] finished at step {resume_steps.get(key, 0)}; training it on to step {configs[key].train.steps}",
                highlight=False,
            )


def last_logged_metrics(client, run_id: str) -> dict[str, float]:
    """Each metric's latest value in the run (what a resume that trained no step reports)."""
    try:
        return dict(client.get_run(run_id).data.metrics)
    except Exception:  # noqa: BLE001 - an unreachable store only costs the summary line
        return {}


def close_arm_run(arm: str, arm_logger: RunLogger, state: dict[str, Any], state_path: Path, *, failed: dict[str, str]) -> None:
    """All seeds of an arm have run: its run gets the per-step means over its seeds and closes.
    When a seed failed it closes FAILED with the error and no means (a resume that trains the
    failed seed logs them once, over every seed)."""
    from polyrl.launch.run_units import log_arm_summary

    failed_seeds = [key for key in failed if key.split("/seed_")[0] == arm]
    if failed_seeds:
        arm_logger.finish_after_error("FAILED", "; ".join(f"{key}: {failed[key]}" for key in failed_seeds))
        return
    # Finished seed runs only: a run started ahead of the decision that ended a sequence is not one of them.
    seed_run_ids = [run_id for key, run_id in state["runs"].items() if key.split("/seed_")[0] == arm and key in state["finished"]]
    log_arm_summary(arm_logger, seed_run_ids)
    arm_logger.finish()
    state["arms_finished"].append(arm)
    write_state(state_path, state)


def _stop_at_step_end(arm: Any, stop: StopSignals):
    """A step callback that honours a stop request: checkpoint this step (unless saved), then unwind."""

    def on_step(step: int, metrics: dict[str, float]) -> None:
        stop.announce()  # a request that came in the middle of a print is said now
        if stop.requested is None or step >= arm.config.train.steps:
            return  # the arm's last step ends the arm normally; the next arm will not start
        latest = latest_checkpoint(arm.checkpointer.arm_dir)
        path = latest if latest is not None and checkpoint_step(latest) == step else arm.checkpointer.save(step)
        raise StopNow(stop.requested, step=step, checkpoint=str(path))

    return on_step


def train_with_progress(arm: Any, console: Console, show: bool, stop: StopSignals | None = None) -> None:
    """Run ``arm``'s loop (a :class:`polyrl.trainer.arm.Arm`) with a progress bar and stop requests honoured."""
    total = arm.config.train.steps
    stop = stop or StopSignals()
    stop.arm()
    try:
        if not show:
            arm.loop(callbacks=[_stop_at_step_end(arm, stop)]).run()
            return
        if not console.is_terminal:
            # A log file, CI or nohup: a bar redraws nothing there, so a plain line every few steps.
            every = max(1, -(-total // PLAIN_LINES_PER_RUN))
            lines = plain_progress_line(arm.name, total, every, plain_printer(console))
            arm.loop(printer=plain_printer(console), callbacks=[lines, _stop_at_step_end(arm, stop)]).run()
            return
        with _progress(console) as progress:
            task = progress.add_task(
                "train", total=total, completed=arm.start_step, arm=arm.name, reward="-", accuracy="-", length="-"
            )

            def show_step(step: int, metrics: dict[str, float]) -> None:
                progress.update(
                    task,
                    completed=step,
                    reward=f"{metrics.get('reward/mean', float('nan')):.3f}",
                    accuracy=f"{metrics.get('train/accuracy', float('nan')):.2f}",
                    length=f"{metrics.get('rollout/response_length/mean', float('nan')):.1f}",
                )

            arm.loop(printer=plain_printer(progress.console), callbacks=[show_step, _stop_at_step_end(arm, stop)]).run()
    finally:
        stop.armed = False


def train_with_lines(
    arm: Any, name: str, echo: Callable[[str], None], stop: StopSignals, orphaned: Callable[[], bool] | None = None
) -> None:
    """Run ``arm``'s loop printing plain progress lines under ``name`` through ``echo`` (a unit
    trained side by side: its driver prints them). ``orphaned()`` true at a step end (the driver
    is gone) is a stop request: checkpoint and unwind, as on SIGTERM."""
    total = arm.config.train.steps
    every = max(1, -(-total // PLAIN_LINES_PER_RUN))

    def check_driver(step: int, metrics: dict[str, float]) -> None:
        if orphaned is not None and stop.requested is None and orphaned():
            stop.requested = signal.SIGTERM

    stop.arm()
    try:
        callbacks = [plain_progress_line(name, total, every, echo), check_driver, _stop_at_step_end(arm, stop)]
        arm.loop(printer=echo, callbacks=callbacks).run()
    finally:
        stop.armed = False


# Without a terminal, about this many progress lines per training run.
PLAIN_LINES_PER_RUN = 8


def plain_progress_line(name: str, total: int, every: int, echo):
    """A step callback printing ``name step k/N · reward … · accuracy … · length … · s/step`` on
    every ``every``-th step and the last one (metrics the arm does not log are left out)."""

    def on_step(step: int, metrics: dict[str, float]) -> None:
        if step % every and step != total:
            return
        shown = [f"{label} {metrics[key]:{spec}}" for label, key, spec in SUMMARY if key in metrics]
        if "perf/step_s" in metrics:
            shown.append(f"{metrics['perf/step_s']:.1f} s/step")
        echo(" · ".join([f"{name} step {step}/{total}", *shown]))

    return on_step


# What the end of polyrl run / submit shows per arm: (label, metric key, format).
SUMMARY = (
    ("reward", "reward/mean", ".3f"),
    ("accuracy", "train/accuracy", ".3f"),
    ("length", "rollout/response_length/mean", ".1f"),
)


def summary_line(name: str, metrics: dict[str, float]) -> str:
    """An arm's last values; a metric the arm does not log (accuracy without an accuracy reward) is left out, not shown as nan."""
    shown = [f"{label} {metrics[key]:{spec}}" for label, key, spec in SUMMARY if key in metrics]
    return f"[cyan]{name}[/]: " + (" · ".join(shown) or "no metrics logged")
