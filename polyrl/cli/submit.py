"""``polyrl submit`` and ``polyrl jobs``: an experiment's arms on a local Ray, or the experiment
as a job on a Ray cluster (Ray's Job Submission API, :mod:`polyrl.launch.ray_jobs`)."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from polyrl.cli.errors import fail, user_errors
from polyrl.config.schema import ConfigError
from polyrl.launch.arm_runs import summary_line
from polyrl.launch.preflight import preflight_file
from polyrl.launch.ray_jobs import DEFAULT_DASHBOARD, TERMINAL, follow_logs, job_client, job_logs, list_jobs, stop_job, submit_job
from polyrl.launch.ray_submit import submit_experiment
from polyrl.launch.run_units import MANY_RUNS

_console = Console()

MANY_RUNS_HELP = f"Start more than {MANY_RUNS} training runs (arms × seeds) in one command; without it such a plan is refused."
ADDRESS_HELP = (
    f"A Ray cluster's job server: its dashboard URL ({DEFAULT_DASHBOARD} for `ray start --head --dashboard-host "
    "127.0.0.1`), its GCS address host:port, 'auto' or ray://host:port. Default: $RAY_API_SERVER_ADDRESS, "
    f"$RAY_ADDRESS, else {DEFAULT_DASHBOARD}."
)


def submit_command(
    config: Path = typer.Argument(..., help="Experiment YAML."),
    set_: list[str] = typer.Option([], "--set", help="Override a key: --set train.steps=5 (repeatable)."),
    address: Optional[str] = typer.Option(
        None,
        "--address",
        help="Submit the experiment as a Ray job to this cluster (its dashboard "
        "URL http://host:8265, GCS host:port, 'auto' or ray://host:port); it runs `polyrl run` "
        "there. Default: the arms as tasks on a local Ray on 127.0.0.1.",
    ),
    parallel_arms: bool = typer.Option(
        True,
        "--parallel/--sequential",
        help="Run arms at the same time when the cluster has the CPUs (a job runs them one after another).",
    ),
    cpus_per_arm: float = typer.Option(
        1.0,
        "--cpus-per-arm",
        help="Ray CPUs per arm (also the arm's torch threads unless "
        "train.threads is set); with --address, the job's driver's CPUs.",
    ),
    gpus_per_arm: float = typer.Option(
        0.0, "--gpus-per-arm", help="Ray GPUs per arm (0: the arm sees no GPU); with --address, the job's driver's GPUs."
    ),
    wait: bool = typer.Option(
        True, "--wait/--no-wait", help="With --address: follow the job's logs until it ends (default) or return with its id."
    ),
    seeds: Optional[str] = typer.Option(
        None,
        "--seeds",
        help="Run every arm with these seeds, each arm × seed a Ray task: a count "
        "(--seeds 3 = 0,1,2) or a list (--seeds 0,1,2); overrides the YAML's seeds and seed.",
    ),
    many_runs: bool = typer.Option(False, "--many-runs", help=MANY_RUNS_HELP),
) -> None:
    """Run the arms of an experiment as Ray tasks (local Ray by default), logged to MLflow under one parent run."""
    with user_errors():  # ArmFailedError exits 1, every other PolyrlError 2
        if address is not None:
            raise typer.Exit(_submit_as_job(config, set_, address, cpus_per_arm, gpus_per_arm, wait, seeds, many_runs))
        if not wait:
            raise ConfigError(
                "--no-wait submits the experiment as a Ray job and needs the cluster's address: --address "
                f"{DEFAULT_DASHBOARD} (a head started with `ray start --head --dashboard-host 127.0.0.1`); "
                "a local Ray started by this command stops when it ends"
            )
        # The arms run on a local Ray from this machine's files: what `polyrl run` checks before any
        # MLflow run or model exists is checked here before Ray starts. (With --address the job's
        # own `polyrl run` checks them on the cluster, where the files are.)
        preflight_file(config, set_options=set_, runs_here=True, echo=lambda line: _console.print(line, highlight=False))
        result = submit_experiment(
            config,
            set_options=set_,
            parallel_arms=parallel_arms,
            cpus_per_arm=cpus_per_arm,
            gpus_per_arm=gpus_per_arm,
            console=_console,
            seeds_option=seeds,
            many_runs=many_runs,
        )
    for name, metrics in result.final_metrics.items():
        _console.print(summary_line(name, metrics))
    _console.print(f"MLflow: {result.tracking_uri} (parent run {result.parent_run_id})")
    _console.print(
        f"Compare the arms: polyrl compare {result.name} --tracking-uri {result.tracking_uri}    ·    "
        f"open the UI: polyrl ui --tracking-uri {result.tracking_uri}"
    )


def _submit_as_job(
    config: Path, set_: list[str], address: str, cpus: float, gpus: float, wait: bool, seeds: str | None, many_runs: bool
) -> int:
    if cpus <= 0:
        raise ConfigError("--cpus-per-arm must be > 0")
    job = submit_job(
        config,
        address=address,
        set_options=set_,
        seeds_option=seeds,
        many_runs=many_runs,
        num_cpus=cpus,
        num_gpus=gpus,
        echo=lambda line: _console.print(escape(line), highlight=False),
    )
    _console.print(
        f"submitted job [cyan]{job.job_id}[/] to {job.address}: {escape(job.entrypoint)}", highlight=False, soft_wrap=True
    )
    _console.print(f"MLflow: {job.tracking_uri}", highlight=False)
    hint = f"--address {address}"
    if not wait:
        _console.print(
            f"follow it: polyrl jobs logs {job.job_id} --follow {hint}    ·    stop it: polyrl jobs stop {job.job_id} {hint}",
            highlight=False,
            soft_wrap=True,
        )
        return 0
    return _follow(job.job_id, address, stop_hint=f"polyrl jobs stop {job.job_id} {hint}")


def _follow(job_id: str, address: str | None, stop_hint: str) -> int:
    client = job_client(address)
    try:
        status = follow_logs(client, job_id, lambda text: (sys.stdout.write(text), sys.stdout.flush()))
    except KeyboardInterrupt:
        _console.print(f"\nstopped following; job {job_id} keeps running (stop it: {stop_hint})", highlight=False)
        return 130
    colour = "green" if status == "SUCCEEDED" else "red"
    _console.print(f"job {job_id}: [{colour}]{status}[/]", highlight=False)
    return 0 if status == "SUCCEEDED" else 1


# --- polyrl jobs ------------------------------------------------------------------------------------

jobs_app = typer.Typer(
    help="Ray jobs on a cluster (Ray's Job Submission API): list them, read or follow their logs, stop them.",
    no_args_is_help=True,
)


def _address_option():
    return typer.Option(None, "--address", help=ADDRESS_HELP)


@jobs_app.command("list")
def jobs_list(address: Optional[str] = _address_option()) -> None:
    """Every job the cluster knows, oldest first: id, status, experiment, start and end."""
    with user_errors():
        jobs = list_jobs(job_client(address))
    ids = [job.submission_id or job.job_id or "" for job in jobs]
    table = Table()
    table.add_column("job", no_wrap=True, min_width=max(map(len, ids), default=3))  # whole ids, to paste into logs/stop
    table.add_column("status", no_wrap=True, min_width=9)  # SUCCEEDED
    for name in ("experiment", "started", "ended", "message"):
        table.add_column(name)
    for job_id, job in zip(ids, jobs):
        metadata = job.metadata or {}
        table.add_row(
            job_id,
            str(job.status.value),
            metadata.get("polyrl.experiment", ""),
            _when(job.start_time),
            _when(job.end_time),
            escape((job.message or "").strip()[:80]),
        )
    _console.print(table if jobs else "no jobs")


def _when(milliseconds: int | None) -> str:
    return datetime.datetime.fromtimestamp(milliseconds / 1000).strftime("%Y-%m-%d %H:%M:%S") if milliseconds else ""


@jobs_app.command("logs")
def jobs_logs(
    job_id: str = typer.Argument(..., help="Job id (polyrl submit prints it; polyrl jobs list shows them)."),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep printing until the job ends; exit 0 if it succeeded, 1 otherwise."
    ),
    address: Optional[str] = _address_option(),
) -> None:
    """A job's logs (the output of its `polyrl run`)."""
    with user_errors():
        if follow:
            raise typer.Exit(_follow(job_id, address, stop_hint=f"polyrl jobs stop {job_id}"))
        sys.stdout.write(job_logs(job_client(address), job_id))


@jobs_app.command("stop")
def jobs_stop(job_id: str = typer.Argument(..., help="Job id."), address: Optional[str] = _address_option()) -> None:
    """Stop a job: its `polyrl run` gets SIGTERM (it stops after the current step), then SIGKILL after Ray's grace
    period (RAY_JOB_STOP_WAIT_TIME_S in the environment `polyrl submit` ran in, else 3 s)."""
    with user_errors():
        status = stop_job(job_client(address), job_id)
    if status not in TERMINAL:
        fail(f"job {job_id} is still {status} after the stop request; try again or look at polyrl jobs logs {job_id}")
    _console.print(f"job {job_id}: {status}", highlight=False)
