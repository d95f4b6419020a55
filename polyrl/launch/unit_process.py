"""Inside a unit trained side by side: the body of its spawned process
(:mod:`polyrl.launch.units_at_once` is the driver's side).

It trains exactly what ``polyrl run`` trains in-process (:func:`polyrl.launch.arm_steps.train_arm`)
and talks back through a pipe: progress lines and polyrl's own warnings (the driver prints them),
then one outcome (finished with its last metrics, failed with the error in words, or stopped by
a signal with its checkpoint). Library logs go to the experiment's log file, as the driver's do.
"""

from __future__ import annotations

import logging
import os
from multiprocessing.connection import Connection
from typing import Any, Callable

from polyrl.config.schema import ExperimentConfig
from polyrl.launch.interrupts import StopNow, StopSignals

__all__ = ["unit_process"]


def unit_process(job: dict[str, Any], conn: Connection) -> None:
    """Body of a unit's spawned process: train it and send back lines, then one outcome."""
    os.setpgrp()  # Ctrl-C at the terminal reaches the driver only; it passes requests on, once each
    os.chdir(job["cwd"])  # relative paths in the YAML resolve as in the driver

    def send(*message: Any) -> None:
        try:
            conn.send(message)
        except (BrokenPipeError, OSError):
            pass  # the driver has gone: the step-end check below stops the unit

    key = job["key"]
    try:
        from polyrl.launch.logs import command_logging

        with command_logging(job["log_path"], verbose=job["verbose"], command=f"{key} (side by side, pid {os.getpid()})"):
            if not job["verbose"]:  # polyrl's own warnings are for the user: the driver prints them
                warnings = _LinesHandler(lambda line: send("line", line))
                warnings.setLevel(logging.WARNING)
                warnings.setFormatter(logging.Formatter(f"warning ({key}): %(message)s"))
                logging.getLogger("polyrl").addHandler(warnings)
            with StopSignals(echo=lambda line: send("line", f"{key}: {line}")) as stop:
                final = _train(job, stop, lambda line: send("line", line))
        send("finished", final)
    except StopNow as error:
        send("stopped", None, None, error.signum, error.step, error.checkpoint)
    except BaseException as error:  # noqa: BLE001 - every ending is reported; train_arm closed the MLflow run
        from polyrl.launch.arm_runs import arm_error_text

        logging.getLogger("polyrl.run").info("unit %r failed", key, exc_info=error)
        send("failed", None, arm_error_text(error) if isinstance(error, Exception) else repr(error))
    finally:
        conn.close()


class _LinesHandler(logging.Handler):
    def __init__(self, echo: Callable[[str], None]):
        super().__init__()
        self.echo = echo

    def emit(self, record: logging.LogRecord) -> None:
        self.echo(self.format(record))


def _train(job: dict[str, Any], stop: StopSignals, echo: Callable[[str], None]) -> dict[str, float] | None:
    import yaml

    from polyrl.launch.arm_runs import last_logged_metrics, train_with_lines
    from polyrl.launch.arm_steps import train_arm
    from polyrl.tracking.mlflow_runs import RunLogger, make_client

    key, driver = job["key"], job["driver_pid"]
    config = ExperimentConfig.model_validate(yaml.safe_load(job["config_yaml"]))
    logger = RunLogger(make_client(job["tracking_uri"]), job["run_id"], buffer_dir=job["arm_dir"])

    def driver_gone() -> bool:
        return os.getppid() != driver

    history = train_arm(
        config,
        arm=job["arm"],
        arm_dir=job["arm_dir"],
        logger=logger,
        parent_run_id=job["parent_run_id"],
        tracking_uri=job["tracking_uri"],
        resume=job["resume"],
        train=lambda arm: train_with_lines(arm, key, echo, stop, orphaned=driver_gone),
        on_resumed=lambda step: echo(f"{key}: resumed from step {step}"),
    )
    return history[-1] if history else last_logged_metrics(logger.client, job["run_id"])
