"""The Ray side of ``polyrl submit``: one arm's task and the supervision of an experiment's arms.

An arm's task runs in a Ray worker process of its own (``max_calls=1``: its models and engine go
with the process). It gets the arm's resolved config as YAML text, never a path, trains it with
:func:`polyrl.launch.arm_steps.train_arm` and marks its MLflow run. The supervisor launches the tasks
(in parallel or one at a time), records finished arms in ``experiment.json``, closes every run
that is still open when an arm fails or the supervision is interrupted, and closes the parent run.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Callable

from polyrl.config.schema import ExperimentConfig
from polyrl.launch.arm_runs import ArmFailedError
from polyrl.launch.arm_steps import train_arm
from polyrl.launch.experiment_folder import read_state, write_state
from polyrl.tracking.mlflow_runs import RunLogger, make_client
from polyrl.tracking.run_logger import terminate_run

# Environment variables a worker needs to behave like the driver (offline hubs, vLLM mode,
# MLflow server credentials). A local cluster inherits the driver's environment anyway.
FORWARDED_ENV_PREFIXES = ("VLLM_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "MLFLOW_", "POLYRL_")


def worker_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key.startswith(FORWARDED_ENV_PREFIXES)}


def arm_task(job: dict[str, Any]) -> dict[str, Any]:
    """Body of one arm's Ray task (runs in a Ray worker process)."""
    import ray
    import yaml

    if job.get("cwd") and os.path.isdir(job["cwd"]):
        os.chdir(job["cwd"])  # relative paths in the YAML resolve as on the driver (same machine / shared fs)
    arm, key = job["arm"], job["key"]
    context = ray.get_runtime_context()
    where = {
        "polyrl.ray.pid": os.getpid(),
        "polyrl.ray.node_id": context.get_node_id(),
        "polyrl.ray.hostname": socket.gethostname(),
    }
    # The arm's folder also holds its MLflow buffer, so a Ray arm outlives a tracking-server outage too.
    logger = RunLogger(make_client(job["tracking_uri"]), job["run_id"], buffer_dir=job["arm_dir"])
    try:
        logger.set_tags(where)
        config = ExperimentConfig.model_validate(yaml.safe_load(job["config_yaml"]))
        history = train_arm(
            config,
            arm=arm,
            arm_dir=job["arm_dir"],
            logger=logger,
            parent_run_id=job["parent_run_id"],
            tracking_uri=job["tracking_uri"],
        )
    except BaseException as error:
        logger.finish_after_error(
            "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        )  # no-op if train_arm already did
        error.add_note(
            f"polyrl: {key!r} (MLflow run {job['run_id']}) failed in Ray worker pid {where['polyrl.ray.pid']} "
            f"on {where['polyrl.ray.hostname']}"
        )
        raise
    return {"arm": arm, "key": key, "final_metrics": history[-1] if history else {}, "steps": len(history), **where}


def supervise_arms(
    jobs: list[dict[str, Any]],
    *,
    parallel: bool,
    task_options: dict[str, Any],
    tracking_uri: str,
    parent_run_id: str,
    state_path: str | None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Launch the arm tasks, gather their results, close the parent run; raises ArmFailedError.

    Runs in the driver: the ``polyrl submit`` process, or a Ray job's.
    Every arm runs even if another fails (arms are independent); the parent run is FAILED if any did.
    """
    import ray

    remote = ray.remote(max_calls=1)(arm_task)  # a fresh worker process per arm: its models and engine go with it
    client = make_client(tracking_uri)
    pending = list(jobs)
    running: dict[Any, dict[str, Any]] = {}
    results: dict[str, dict[str, Any]] = {}
    failures: dict[str, BaseException] = {}

    def launch() -> None:
        while pending and (parallel or not running):
            job = pending.pop(0)
            ref = remote.options(name=f"polyrl:{job['experiment']}:{job['key']}", **task_options).remote(job)
            running[ref] = job

    try:
        launch()
        while running:
            done, _ = ray.wait(list(running), num_returns=1)
            job = running.pop(done[0])
            key = job["key"]
            try:
                results[key] = ray.get(done[0])
                echo(f"{key}: finished in Ray worker pid {results[key]['polyrl.ray.pid']} ({results[key]['steps']} steps)")
                if state_path:
                    state = read_state(Path(state_path))
                    state.setdefault("finished", []).append(key)
                    write_state(Path(state_path), state)
            except Exception as error:  # noqa: BLE001 - RayTaskError (the arm raised) or the worker died
                failures[key] = error
                finish_if_running(client, job["run_id"], "FAILED")  # the worker may have died before it could
                echo(f"{key}: FAILED ({type(error).__name__})")
            launch()
    except BaseException:  # Ctrl-C or a lost cluster: stop the arms, close every run still open
        for ref in running:
            ray.cancel(ref, force=True)
        for job in jobs:
            if job["key"] not in results and job["key"] not in failures:
                finish_if_running(client, job["run_id"], "KILLED")
        for arm_run_id in {job["arm_run_id"] for job in jobs if job.get("arm_run_id")}:
            finish_if_running(client, arm_run_id, "KILLED")
        terminate_run(client, parent_run_id, "KILLED")
        raise
    _close_seeded_arm_runs(client, jobs, failures)
    terminate_run(client, parent_run_id, "FAILED" if failures else "FINISHED")
    if failures:
        lines = [
            f"{key!r} (MLflow run {next(j['run_id'] for j in jobs if j['key'] == key)}) failed: {_root_cause(error)}"
            for key, error in failures.items()
        ]
        raise ArmFailedError("\n".join(lines)) from next(iter(failures.values()))
    return results


def _close_seeded_arm_runs(client, jobs: list[dict[str, Any]], failures: dict[str, BaseException]) -> None:
    """Each arm's run over seeds: the per-step mean over its seeds, then FINISHED (FAILED if a seed failed)."""
    from polyrl.launch.run_units import log_arm_summary

    by_arm: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        if job.get("arm_run_id"):
            by_arm.setdefault(job["arm_run_id"], []).append(job)
    for arm_run_id, arm_jobs in by_arm.items():
        logger = RunLogger(client, arm_run_id)
        finished = [job["run_id"] for job in arm_jobs if job["key"] not in failures]
        if finished:
            log_arm_summary(logger, finished)
        logger.finish("FAILED" if len(finished) < len(arm_jobs) else "FINISHED")


def finish_if_running(client, run_id: str, status: str) -> None:
    if client.get_run(run_id).info.status == "RUNNING":
        terminate_run(client, run_id, status)


def _root_cause(error: BaseException) -> str:
    cause = getattr(error, "cause", None) or error  # ray.exceptions.RayTaskError keeps the arm's exception
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
