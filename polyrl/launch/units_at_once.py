"""Seed runs at once: several arm × seed units of one ``polyrl run`` trained side by side, each in
a process of its own with its share of the cores.

Why: seeds are a comparison's unit of evidence, so seed-runs per hour is the speed a study
needs, and on a few CPU cores what one run does on one thread anyway (start-up, Python between
the kernels, decoding) can overlap with another run's work (docs/benchmarks.md, "Seed runs per
hour"). ``seeds_at_once`` (:func:`polyrl.config.seeds.seeds_at_once_setting`) says how
many run together; :func:`resolve_at_once` turns ``auto`` into a number for this machine and
these arms.

What does not change: a unit's result. Each unit is a fresh spawned interpreter that trains
exactly what ``polyrl run`` trains in-process (:func:`polyrl.launch.arm_steps.train_arm`), with
its config, seed and ``train.threads``; nothing is shared between units but the MLflow store
and the console. A seed's metrics are the same run alone or beside another *at the same thread
count*; a different thread count changes the order of float reductions (and so, after a few
steps, the samples), which is why the thread count each unit got is its ``train.threads``
param in MLflow.

The driver (the ``polyrl run`` process) keeps every piece of bookkeeping: it opens each unit's
MLflow run before the unit starts and records it finished (or failed) from the unit's last
message. Units talk back through a pipe: progress lines (the driver prints them, named by the
unit), then one outcome (:mod:`polyrl.launch.unit_process` is the unit's side;
:mod:`polyrl.launch.side_by_side` the experiment's bookkeeping and the rounds). Signals: a unit starts its own process group, so Ctrl-C reaches only
the driver, which passes each request on once (stop after the current step with a checkpoint;
a second request stops at once); a unit whose driver has gone stops at its next step end.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable

from polyrl.config.schema import ConfigError, ExperimentConfig, to_yaml
from polyrl.core.errors import PolyrlError
from polyrl.launch.interrupts import StopSignals
from polyrl.launch.unit_process import unit_process

__all__ = ["SideBySide", "UnitJob", "UnitOutcome", "resolve_at_once"]

# After a second stop request a unit has this long to unwind before it is killed.
KILL_AFTER_S = 60.0


def resolve_at_once(
    setting: int | str, configs: dict[str, ExperimentConfig], seeds: list[int] | None, cores: int | None = None
) -> tuple[int, str]:
    """How many units run at once, and why, in words. ``auto``: two on a CPU-only machine of two
    or more cores when the experiment has seeds and no arm starts processes of its own; one
    otherwise. A number is taken as asked, after the checks that make it meaningful."""
    cores = cores or os.cpu_count() or 1
    spreads = sorted(
        f"arms.{arm}.{key}"
        for arm, config in configs.items()
        for key, value in (("train.learner_workers", config.train.learner_workers), ("rollout.workers", config.rollout.workers))
        if value > 1
    )
    on_gpu = sorted(arm for arm, config in configs.items() if _uses_gpu(config))
    if setting == "auto":
        if seeds is None or len(seeds) * len(configs) < 2:
            return 1, "one run per arm"
        if cores < 2:
            return 1, "one core"
        if on_gpu:
            return 1, f"arm {on_gpu[0]!r} trains on a GPU"
        if spreads:
            return 1, f"{spreads[0]} > 1 starts processes of its own"
        return 2, f"auto: {cores} CPU cores"
    count = int(setting)
    if count > 1:
        if seeds is None:
            raise ConfigError(
                f"seeds_at_once: {count}: it runs seed runs side by side and this experiment has no seeds "
                "(one run per arm); add seeds (or --seeds), or set seeds_at_once: 1"
            )
        if count > cores:
            raise ConfigError(
                f"seeds_at_once: {count}: more than this machine's {cores} cores (each run needs at least one thread); "
                f"allowed: 1 to {cores}, or auto"
            )
        if spreads:
            raise ConfigError(
                f"seeds_at_once: {count}: {spreads[0]} > 1 starts processes of its own, which runs side by side would "
                "share; allowed here: 1, or auto"
            )
    return count, "as set"


def _uses_gpu(config: ExperimentConfig) -> bool:
    from polyrl.runtime.devices import resolve_device_name

    return resolve_device_name(config.train.device).startswith("cuda")


def threads_per_unit(at_once: int, cores: int | None = None) -> int:
    return max(1, (cores or os.cpu_count() or 1) // at_once)


def side_by_side_line(at_once: int, why: str) -> str:
    """What ``polyrl validate`` and ``polyrl run`` say of a choice of more than one at once."""
    return (
        f"seed runs side by side: {at_once} at a time, {threads_per_unit(at_once)} thread(s) each ({why}; "
        "seeds_at_once: 1 runs them one after another)"
    )


def with_threads(config: ExperimentConfig, threads: int) -> ExperimentConfig:
    """The unit's config with ``train.threads`` set (kept when the YAML sets it): logged as a param."""
    if config.train.threads is not None:
        return config
    return config.model_copy(update={"train": config.train.model_copy(update={"threads": threads})})


@dataclass
class UnitJob:
    """What a unit's process needs: everything as plain values (the process is spawned)."""

    key: str
    arm: str
    config: ExperimentConfig
    arm_dir: Path
    run_id: str
    parent_run_id: str
    tracking_uri: str
    resume: bool
    log_path: Path
    verbose: bool

    def message(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "arm": self.arm,
            "config_yaml": to_yaml(self.config),
            "arm_dir": str(self.arm_dir),
            "run_id": self.run_id,
            "parent_run_id": self.parent_run_id,
            "tracking_uri": self.tracking_uri,
            "resume": self.resume,
            "log_path": str(self.log_path),
            "verbose": self.verbose,
            "cwd": os.getcwd(),
            "driver_pid": os.getpid(),
        }


@dataclass
class UnitOutcome:
    """How a unit ended: ``finished`` (with its last step's metrics, None when it trained no
    step), ``failed`` (with the error in words) or ``stopped`` (by a signal, with its checkpoint)."""

    key: str
    status: str
    final_metrics: dict[str, float] | None = None
    error: str | None = None
    signum: int | None = None
    step: int | None = None
    checkpoint: str | None = None


@dataclass
class _Running:
    job: UnitJob
    process: Any
    conn: Connection
    outcome: UnitOutcome | None = None
    signals_sent: int = 0
    conn_open: bool = True  # False once the unit closed its end: its pipe is no longer waited on
    killed_at: float | None = None


class SideBySide:
    """Up to ``at_once`` units running, each in a spawned process; the driver's side.

    :meth:`wait_for` trains queued units until the named ones have ended, keeping every slot
    busy: from the queue first, then from ``ahead`` (with until_resolved: the next round's units,
    started before this round's decision so a core does not idle while the round's slowest run
    finishes). ``on_outcome`` sees each ending as it comes. Stop requests (``stop``) are passed
    on to every running unit and nothing new starts; with ``fail_fast`` a failure does the same.
    """

    def __init__(
        self,
        at_once: int,
        *,
        threads: int,
        echo: Callable[[str], None],
        stop: StopSignals,
        on_outcome: Callable[[UnitOutcome], None],
        fail_fast: bool = False,
    ):
        self.at_once, self.threads, self.echo, self.stop = at_once, threads, echo, stop
        self.on_outcome, self.fail_fast = on_outcome, fail_fast
        self.context = multiprocessing.get_context("spawn")  # a fresh interpreter: no vLLM or torch state inherited
        self.queue: list[UnitJob] = []
        self.running: list[_Running] = []
        self.ended: dict[str, UnitOutcome] = {}
        self.stopping: int | None = None  # the signal passed on to every unit, once

    def add(self, jobs: list[UnitJob]) -> None:
        self.queue.extend(jobs)

    def running_keys(self) -> list[str]:
        return [unit.job.key for unit in self.running]

    def wait_for(self, keys: set[str], ahead: Callable[[], UnitJob | None] | None = None) -> None:
        """Train until every unit in ``keys`` (queued or running) has ended, or a stop request or
        a failure under ``fail_fast`` has ended them all."""
        self.stop.armed = True  # a first request waits for the units' step ends; a second one stops at once
        try:
            while not keys <= set(self.ended) and (self.queue or self.running):
                self.stop.announce()
                if self.stop.requested is not None and self.stopping is None:
                    self._stop_everything(self.stop.requested)
                self._fill(ahead)
                self._wait_once()
        except KeyboardInterrupt as error:  # a second request: pass it on (the units stop at once), then wait for them
            self._unwind(getattr(error, "signum", signal.SIGINT))
            raise
        finally:
            self.stop.armed = False

    def stop_units(self, keys: list[str], signum: int = signal.SIGTERM) -> None:
        """Ask these running units to stop at their next step end (with a checkpoint) and wait for them."""
        for unit in self.running:
            if unit.job.key in keys:
                self._signal_unit(unit, signum)
        self.wait_for(set(keys))

    def _fill(self, ahead: Callable[[], UnitJob | None] | None) -> None:
        while len(self.running) < self.at_once and self.stopping is None:
            job = self.queue.pop(0) if self.queue else (ahead() if ahead is not None else None)
            if job is None:
                return
            self._start(job)

    def _start(self, job: UnitJob) -> None:
        receive, send = self.context.Pipe(duplex=False)
        process = self.context.Process(target=unit_process, args=(job.message(), send), name=f"polyrl:{job.key}")
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(job.config.train.threads or self.threads)  # read by torch as the child starts
        try:
            process.start()
        finally:
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        send.close()
        self.running.append(_Running(job, process, receive))

    def _signal_unit(self, unit: _Running, signum: int) -> None:
        if unit.process.pid is not None and unit.process.is_alive():
            _signal(unit.process.pid, signum)
            unit.signals_sent += 1
            if unit.signals_sent >= 2 and unit.killed_at is None:
                unit.killed_at = time.monotonic() + KILL_AFTER_S

    def _stop_everything(self, signum: int) -> None:
        self.stopping = signum
        self.queue.clear()
        for unit in self.running:
            self._signal_unit(unit, signum)

    def _read(self, unit: _Running) -> None:
        try:
            while unit.conn.poll():
                message = unit.conn.recv()
                if message[0] == "line":
                    self.echo(message[1])
                else:
                    unit.outcome = UnitOutcome(unit.job.key, *message)
        except (EOFError, OSError):
            unit.conn_open = False  # else wait() would return at once, again and again, until the process ends

    def _wait_once(self) -> None:
        if not self.running:
            return
        ready = wait([u.conn for u in self.running if u.conn_open] + [u.process.sentinel for u in self.running], timeout=0.5)
        for unit in list(self.running):
            if unit.conn in ready:
                self._read(unit)
            if unit.process.sentinel in ready or not unit.process.is_alive():
                unit.process.join()
                self._read(unit)
                self.running.remove(unit)
                outcome = unit.outcome or self._silent_ending(unit)
                if unit.outcome is not None and outcome.status != "finished":
                    # Stopped or failed before train_arm could close its run (e.g. while building): close it here.
                    _close_run(unit.job, "KILLED" if outcome.status == "stopped" else "FAILED", outcome.error)
                self.ended[outcome.key] = outcome
                self.on_outcome(outcome)
                if outcome.status == "failed" and self.fail_fast and self.stopping is None:
                    self._stop_everything(signal.SIGTERM)
        for unit in self.running:
            if unit.killed_at is not None and time.monotonic() > unit.killed_at:
                unit.process.kill()

    def _silent_ending(self, unit: _Running) -> UnitOutcome:
        """A unit whose process ended without its last message: stopped, when a signal was passed
        to it (it came before the unit could catch it, e.g. while it was still importing); else
        failed (killed from outside, out of memory). Its MLflow run is closed here."""
        if unit.signals_sent:
            signum = self.stopping or signal.SIGTERM
            _close_run(unit.job, "KILLED", f"stopped by {signal.Signals(signum).name} while starting")
            return UnitOutcome(unit.job.key, "stopped", signum=signum)
        error = f"its process ended without a result (exit code {unit.process.exitcode})"
        _close_run(unit.job, "FAILED", error)
        return UnitOutcome(unit.job.key, "failed", error=error)

    def _unwind(self, signum: int) -> None:
        self.queue.clear()
        for unit in self.running:
            self._signal_unit(unit, signum)
        for unit in list(self.running):
            unit.process.join(KILL_AFTER_S)
            if unit.process.is_alive():
                unit.process.kill()
                unit.process.join()
            self._read(unit)
            if unit.outcome is None:
                _close_run(unit.job, "KILLED", f"stopped by {signal.Signals(signum).name}")
        self.running.clear()


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # it ended between the check and the signal


def _close_run(job: UnitJob, status: str, message: str | None) -> None:
    """A unit that died without closing its MLflow run (killed, out of memory): close it here."""
    from polyrl.launch.ray_workers import finish_if_running
    from polyrl.tracking.mlflow_runs import make_client

    try:
        client = make_client(job.tracking_uri)
        if message and client.get_run(job.run_id).info.status == "RUNNING":
            client.set_tag(job.run_id, "polyrl.error", message)
        finish_if_running(client, job.run_id, status)
    except Exception:  # noqa: BLE001 - the store is away: the run stays RUNNING and a resume closes it
        logging.getLogger("polyrl.run").warning("could not mark %s's MLflow run %s", job.key, status, exc_info=True)


class UnitsFailed(PolyrlError):
    """With ``fail_fast``: a unit running side by side failed and the others were stopped."""

    resumable = True
