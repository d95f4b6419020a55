"""Run an experiment file: every arm in turn, one MLflow parent run, resumable.

The experiment's folder (``<checkpoint.dir>/<name>/``) holds ``experiment.json`` — the MLflow
run ids, which arms finished and each arm's resolved config — the run lock, and one checkpoint
folder per arm (:mod:`polyrl.launch.experiment_folder`). ``resume=True`` picks up the same MLflow runs and each unfinished arm's latest
checkpoint, after checking the config still matches the one the run was trained with
(:mod:`polyrl.launch.resume_config`).

What a run guarantees when things go wrong (docs/checkpoints.md):
an unreachable MLflow server is reported before anything loads and is outlived mid-run
(:mod:`polyrl.tracking.mlflow_runs`); one run per folder (:mod:`polyrl.launch.run_lock`);
SIGTERM and Ctrl-C stop at a step boundary with a checkpoint (:mod:`polyrl.launch.interrupts`);
every user-facing error that ends an arm marks its MLflow runs FAILED with the message and,
when resuming can fix it, says how to resume. Arms are independent: an arm that fails does not
stop the others (unless ``fail_fast``); at the end every failed arm is named with its error and
the command exits 1 (:class:`ArmFailedError`), and ``--resume`` retrains only those.
"""

from __future__ import annotations

import shlex
import signal
from pathlib import Path
from typing import Any

from rich.console import Console

from polyrl.config.schema import ConfigError, ExperimentConfig, parse_set_options, read_yaml, resolve_arms
from polyrl.config.seeds import experiment_seeds
from polyrl.config.until_resolved import UntilResolvedConfig, until_resolved_plan
from polyrl.core.errors import PolyrlError
from polyrl.launch.arm_runs import (  # noqa: F401 - ArmFailedError and plain_printer: importable from here too
    ArmFailedError,
    ExperimentResult,
    arm_error_text,
    arms_failed,
    close_arm_run,
    last_logged_metrics,
    plain_printer,
    reopen_extended_arms,
    train_with_progress,
)
from polyrl.launch.arm_steps import start_experiment_run, yaml_text
from polyrl.launch.experiment_folder import (
    STATE_FILE,
    archive_previous_run,
    check_seeds_on_resume,
    experiment_dir,
    read_state,
    repoint_archived_runs,
    resume_plan,
    write_state,
)
from polyrl.launch.experiment_run import ExperimentRun
from polyrl.launch.interrupts import RunInterrupted, StopSignals
from polyrl.launch.resume_config import ConfigChange
from polyrl.launch.rounds import TrainingClock, check_fixed_plan, fixed_plan, order_in_rounds
from polyrl.launch.run_lock import acquire_lock
from polyrl.launch.run_units import RunUnit
from polyrl.launch.units_at_once import resolve_at_once, side_by_side_line, threads_per_unit, with_threads
from polyrl.tracking.mlflow_runs import (
    ExperimentTracker,
    probe_tracking,
    resolve_tracking_uri,
)
from polyrl.trainer.checkpoint import latest_checkpoint

# --- polyrl run ---------------------------------------------------------------------------------


def resume_command(
    path: str | Path, set_options: list[str] | None, only_arms: list[str] | None, seeds_option: str | None = None
) -> str:
    words = ["polyrl", "run", str(path), "--resume"]
    for option in set_options or []:
        words += ["--set", option]
    for arm in only_arms or []:
        words += ["--arm", arm]
    if seeds_option is not None:
        words += ["--seeds", seeds_option]
    return shlex.join(words)


def run_experiment(
    path: str | Path,
    *,
    set_options: list[str] | None = None,
    resume: bool = False,
    only_arms: list[str] | None = None,
    console: Console | None = None,
    show_progress: bool | None = None,
    allow_config_change: bool = False,
    seeds_option: str | None = None,
    fail_fast: bool = False,
    many_runs: bool = True,
    seeds_at_once: str | None = None,
    verbose: bool = False,
) -> ExperimentResult:
    """``seeds_option`` is ``--seeds`` (``"3"`` or ``"0,1,2"``); it overrides the file's seeds.
    ``seeds_at_once`` is ``--seeds-at-once`` (``auto`` or a number), over the file's setting.

    An arm that fails is recorded and the next one starts; once all have run,
    :class:`ArmFailedError` names every failed arm. ``fail_fast``: the first failure ends the run.
    ``many_runs=False`` refuses a plan of more than :data:`polyrl.launch.run_units.MANY_RUNS` runs.
    """
    from polyrl.launch.run_units import load_plan

    console = console or Console()
    configs, seeds, rounds, at_once_setting = load_plan(
        path, set_options=set_options, seeds_option=seeds_option, many_runs=many_runs, seeds_at_once_option=seeds_at_once
    )
    if only_arms:
        unknown = sorted(set(only_arms) - set(configs))
        if unknown:
            raise ConfigError(f"--arm {unknown}: no such arm; allowed: {', '.join(configs)}")
        if rounds is not None:
            compared = sorted({arm for c in rounds.comparisons for arm in c.arms} - set(only_arms))
            if compared:
                raise ConfigError(f"--arm: until_resolved compares {', '.join(compared)} too; a round needs every compared arm")
        configs = {name: cfg for name, cfg in configs.items() if name in only_arms}
    at_once, at_once_why = resolve_at_once(at_once_setting, configs, seeds)
    if allow_config_change and not resume:
        raise ConfigError("--allow-config-change only applies with --resume")
    first = next(iter(configs.values()))
    folder = experiment_dir(first)
    # An unreachable tracking server is reported in seconds, before the folder is touched or
    # any model loads.
    probe_tracking(read_state(folder / STATE_FILE).get("tracking_uri") or resolve_tracking_uri(first.tracking.uri))
    hint = resume_command(path, set_options, only_arms, seeds_option)
    where: dict[str, Any] = {"arm": None, "started": False}
    lock = acquire_lock(folder, experiment=first.name, command=shlex.join(["polyrl", "run", str(path)]), echo=console.print)
    try:
        with StopSignals(echo=console.print) as stop:
            return _run_locked(
                path,
                configs,
                seeds,
                first,
                folder,
                resume=resume,
                allow_config_change=allow_config_change,
                console=console,
                show_progress=show_progress,
                stop=stop,
                where=where,
                fail_fast=fail_fast,
                rounds=rounds,
                at_once=(at_once, at_once_why),
                verbose=verbose,
            )
    except KeyboardInterrupt as error:
        raise _interrupted(error, folder, where, hint) from None
    except PolyrlError as error:
        if getattr(error, "resumable", False) and where["started"]:
            error.args = (f"{error}\nContinue with: {hint}",)
        raise
    finally:
        lock.release()


def _interrupted(error: KeyboardInterrupt, folder: Path, where: dict[str, Any], hint: str) -> RunInterrupted:
    arm = where["arm"]
    signum = getattr(error, "signum", signal.SIGINT)
    name = signal.Signals(signum).name
    step, checkpoint = getattr(error, "step", None), getattr(error, "checkpoint", None)
    if step is not None and checkpoint:
        kept = f"after step {step} of arm {arm!r}: checkpoint {checkpoint} saved"
    elif arm is not None:
        latest = latest_checkpoint(folder / arm)
        kept = f"during arm {arm!r}: " + (f"its latest checkpoint is {latest}" if latest else "it had no checkpoint yet")
    else:
        kept = "between arms (finished arms are kept)" if where["started"] else "before any arm started"
    return RunInterrupted(f"stopped by {name} {kept}; the MLflow runs are marked KILLED. Continue with: {hint}", signum)


def _run_locked(
    path,
    configs,
    seeds,
    first,
    folder,
    *,
    resume,
    allow_config_change,
    console,
    show_progress,
    stop: StopSignals,
    where: dict[str, Any],
    fail_fast: bool = False,
    rounds: UntilResolvedConfig | None = None,
    at_once: tuple[int, str] = (1, "as set"),
    verbose: bool = False,
) -> ExperimentResult:
    from polyrl.launch.run_units import expand_units

    state_path = folder / STATE_FILE
    state = read_state(state_path)
    if resume and not state:
        raise ConfigError(f"--resume: no earlier run of {first.name!r} in {folder} (no {STATE_FILE}); run without --resume")
    units = expand_units(configs, seeds)
    if at_once[0] > 1:
        # Side by side each unit trains with its share of the cores, recorded in its config (and so
        # compared by --resume: the same setting resumes, another one is a train.threads change).
        threads = threads_per_unit(at_once[0])
        units = [RunUnit(unit.arm, unit.seed, with_threads(unit.config, threads)) for unit in units]
    unit_configs = {unit.key: unit.config for unit in units}
    changes: dict[str, list[ConfigChange]] = {}
    resume_steps: dict[str, int] = {}
    archived, old_state = None, state
    if resume:
        check_seeds_on_resume(state, seeds, first.name)
        if rounds is not None:
            check_fixed_plan(state.get("until_resolved"), rounds, str(path))
            # A sequence stopped by its hours (or a failed seed) goes on: its arm runs reopen and
            # close again over every seed run so far when the sequence next stops.
            state["arms_finished"] = []
        changes, resume_steps = resume_plan(unit_configs, folder, state, allow=allow_config_change, echo=console.print)
        reopen_extended_arms(state, changes, resume_steps, unit_configs, console)
    else:
        # A new run never overwrites an earlier one's checkpoints: keep them beside it.
        archived = archive_previous_run(folder)
        state = {}
    tracking_uri = state.get("tracking_uri") or resolve_tracking_uri(first.tracking.uri)
    tracker = ExperimentTracker(tracking_uri, first.tracking.experiment or first.name)
    if archived is not None:
        repoint_archived_runs(tracker, old_state, archived, console.print)
    parent = start_experiment_run(
        tracker,
        first.name,
        arms=list(configs),
        yaml_text=yaml_text(path),
        config_path=path,
        resume_run_id=state.get("parent_run_id"),
        buffer_dir=folder,
        echo=console.print,
        tags=None if seeds is None else {"polyrl.seeds": ",".join(map(str, seeds))},
    )
    for key, default in (("arms", {}), ("finished", []), ("arm_configs", {})):
        state.setdefault(key, default)
    if seeds is not None:
        state.setdefault("runs", {})
        state.setdefault("arms_finished", [])
    state.update(
        tracking_uri=tracking_uri, parent_run_id=parent.run_id, experiment=first.name, config_path=str(path), seeds=seeds
    )
    if rounds is not None:
        state.setdefault("until_resolved", fixed_plan(rounds))
    write_state(state_path, state)
    where["started"] = True
    show_progress = first.tracking.progress if show_progress is None else show_progress
    result = ExperimentResult(first.name, tracking_uri, parent.run_id, {}, experiment_dir=folder, seeds=seeds)
    console.print(
        f"[bold]polyrl[/] experiment [cyan]{first.name}[/] · arms: {', '.join(configs)}"
        + (f" · seeds: {', '.join(map(str, seeds))}" if seeds is not None else "")
        + f" · MLflow: {tracking_uri}"
    )
    schedule = [units] if rounds is None else order_in_rounds(units, rounds)
    if at_once[0] > 1:
        console.print(side_by_side_line(*at_once), highlight=False)
    if rounds is not None:
        console.print(
            f"until resolved: {len(rounds.comparisons)} comparison(s), rounds of {rounds.seeds_per_round} seed(s) up to "
            f"{rounds.max_seeds}, α = {rounds.alpha} ({rounds.spending} spending)"
            + (f", at most {rounds.max_hours} h of training" if rounds.max_hours else ""),
            highlight=False,
        )
    run = ExperimentRun(
        configs=configs,
        seeds=seeds,
        folder=folder,
        state=state,
        tracker=tracker,
        parent=parent,
        result=result,
        changes=changes,
        resume_steps=resume_steps,
        resume=resume,
        console=console,
        show_progress=show_progress,
        stop=stop,
        where=where,
        fail_fast=fail_fast,
        units=len(units),
        rounds=rounds,
        clock=TrainingClock(state) if rounds is not None else None,
        at_once=at_once[0],
        verbose=verbose,
    )
    return run.run(schedule)


def validate_file(path: str | Path, set_options: list[str] | None = None) -> dict[str, ExperimentConfig]:
    """Resolve and validate every arm; also checks that reward modules resolve."""
    from polyrl.rewards import load_reward_class

    raw = read_yaml(path)
    configs = resolve_arms(raw, source=str(path), overrides=parse_set_options(set_options or []))
    experiment_seeds(raw, source=str(path))  # a bad seeds key is refused here too
    until_resolved_plan(raw, list(configs), source=str(path))  # and a bad until_resolved block
    for arm, config in configs.items():
        for index, spec in enumerate(config.rewards):
            try:
                load_reward_class(spec.module)
            except Exception as error:  # noqa: BLE001 - reported as a config error with its path
                raise ConfigError(
                    f"{path}: invalid experiment config\n  - rewards[{index}].module (arm {arm!r}): {error}"
                ) from None
    return configs


__all__ = ["run_experiment", "validate_file", "ExperimentResult", "read_yaml"]
