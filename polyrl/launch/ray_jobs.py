"""Experiments as Ray jobs: ``polyrl submit exp.yaml --address ADDR`` and ``polyrl jobs``.

A job goes through Ray's Job Submission API (:class:`ray.job_submission.JobSubmissionClient`,
the head's dashboard server): the working folder (this process's current directory) travels as
the job's ``runtime_env.working_dir``, the driver's ``polyrl`` package as ``py_modules`` (so the
cluster runs the submitter's code), and the entrypoint is ``python -m polyrl.cli.main run
<yaml> ...`` with the submitter's ``--set``/``--seeds``. The job is the run's driver on the head:
inside it ``RAY_ADDRESS`` names the cluster, so the run's rollout workers and learner ranks are
placed there, and its arms run one after another. The job outlives the command; ``polyrl jobs``
lists, follows and stops jobs through the same API.

Outputs are made absolute on the submitting machine before they travel: a local MLflow store
(``sqlite:///mlflow.db``) and a relative ``checkpoint.dir`` would otherwise land inside the job's
temporary copy of the working folder, where nobody finds them. On a multi-node cluster they must
be on a shared filesystem, and MLflow should be a server (``tracking.uri: http://host:5000``).

A bad address fails in seconds: the endpoint is probed with a TCP connection first (the client
would otherwise retry for minutes), and a Ray GCS address (``host:port``, ``auto``) is asked once
for its dashboard's address. Every HTTP request of the client then has a timeout
(:class:`TimedJobClient`; ``requests`` has none by default): a server that accepts connections
and never answers fails the command within :data:`FIRST_REPLY_TIMEOUT_S` (the client's first
request, its version check) or :data:`REPLY_TIMEOUT_S` (later requests), naming the address.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shlex
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from polyrl.config.schema import ConfigError
from polyrl.launch.ray_submit import (
    ADDRESS_PROBE_TIMEOUT_S,
    RayUnreachableError,
    absolute_tracking_uri,
    is_local_store,
    probe_ray_address,
    ray_auth_refusal,
    send_ray_token,
)
from polyrl.launch.ray_workers import worker_env
from polyrl.launch.run_lock import acquire_lock
from polyrl.launch.run_units import load_plan
from polyrl.tracking.mlflow_runs import resolve_tracking_uri

DEFAULT_DASHBOARD = "http://127.0.0.1:8265"  # `ray start --head --dashboard-host 127.0.0.1`'s job server
ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")  # the client lets these override any address it is given
# Left out of the working folder that travels (Ray also honours the folder's .gitignore): outputs
# and environments, which are large and meaningless on the cluster.
WORKING_DIR_EXCLUDES = [".git", ".venv", "venv", "__pycache__", "*.pyc", "mlflow.db", "mlflow.db-*", "mlruns", "mlartifacts"]
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
CONNECT_TIMEOUT_S = ADDRESS_PROBE_TIMEOUT_S  # a TCP connection to the job server
FIRST_REPLY_TIMEOUT_S = ADDRESS_PROBE_TIMEOUT_S  # its reply to the version check every client starts with
REPLY_TIMEOUT_S = 120.0  # any later reply (a submission's upload of the working folder is acknowledged within it)


class JobError(ConfigError):
    """A job the cluster does not know, or a request it refused."""


@dataclass(frozen=True)
class SubmittedJob:
    job_id: str
    address: str  # the dashboard URL the job went to
    entrypoint: str
    tracking_uri: str


# --- the cluster's job server ---------------------------------------------------------------------


def default_address() -> str:
    return next((os.environ[key] for key in ADDRESS_ENV if os.environ.get(key)), DEFAULT_DASHBOARD)


def dashboard_url(address: str, timeout: float = ADDRESS_PROBE_TIMEOUT_S) -> str:
    """The job server's HTTP address for ``address`` (a dashboard URL, a GCS ``host:port``, ``auto``
    or ``ray://``), in seconds or with :class:`RayUnreachableError` naming what is wrong."""
    if address.startswith(("http://", "https://")):
        scheme, rest = address.split("://", 1)
        netloc = rest.split("/", 1)[0]
        host, sep, port = netloc.rpartition(":")
        if not sep or not port.isdigit():
            host, port = netloc, "8265"
        _probe(address, host.strip("[]"), int(port), timeout)
        return f"{scheme}://{netloc}" + ("" if sep else ":8265")
    probe_ray_address(address, timeout)  # host:port, auto, ray://: the GCS or Ray Client port answers
    if address.startswith("ray://"):
        return address  # Ray asks the Ray Client server for the dashboard's address
    return _dashboard_from_gcs(address, timeout)


def _probe(address: str, host: str, port: int, timeout: float) -> None:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        raise RayUnreachableError(
            f"--address {address}: cannot reach a Ray cluster at {host}:{port} ({reason}; checked within {timeout:g} s). Start "
            "one with its job server (ray start --head --dashboard-host 127.0.0.1) or fix the address"
        ) from None


def _dashboard_from_gcs(address: str, timeout: float) -> str:
    import ray
    from ray._private import ray_constants
    from ray._private.services import canonicalize_bootstrap_address
    from ray._raylet import GcsClient

    send_ray_token(address)
    gcs = canonicalize_bootstrap_address(address)
    try:
        found = GcsClient(address=gcs).internal_kv_get(
            ray_constants.DASHBOARD_ADDRESS.encode(), ray_constants.KV_NAMESPACE_DASHBOARD, timeout=timeout
        )
    except ray.exceptions.AuthenticationError as error:
        raise RayUnreachableError(ray_auth_refusal(address, error, send_ray_token(address))) from None
    except Exception as error:  # noqa: BLE001 - a port that answers but is no GCS, or a GCS that does not reply in time
        raise RayUnreachableError(
            f"--address {address}: {gcs} answers but is not a Ray cluster's GCS that replied within "
            f"{timeout:g} s ({type(error).__name__}: {error})"
        ) from None
    if not found:
        raise RayUnreachableError(
            f"--address {address}: the Ray cluster at {gcs} runs no dashboard, so no job server: start its "
            "head with one (ray start --head --include-dashboard true --dashboard-host 127.0.0.1)"
        )
    return f"http://{found.decode()}"


@contextlib.contextmanager
def _explicit_address() -> Iterator[None]:
    """The client replaces the address it is given with RAY_ADDRESS when that is set; the
    address the user named wins here."""
    saved = {key: os.environ.pop(key) for key in ADDRESS_ENV if key in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@functools.cache
def timed_job_client_class() -> type:
    """:class:`ray.job_submission.JobSubmissionClient` with a timeout on every request (built on
    first use: the CLI imports Ray only when a command needs it)."""
    import requests
    from ray.job_submission import JobSubmissionClient

    class TimedJobClient(JobSubmissionClient):
        """A job client whose requests time out: ``(CONNECT_TIMEOUT_S, reply)`` seconds, the
        reply's :data:`FIRST_REPLY_TIMEOUT_S` for the version check, else :attr:`reply_timeout_s`."""

        reply_timeout_s = REPLY_TIMEOUT_S

        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            reply = FIRST_REPLY_TIMEOUT_S if endpoint == "/api/version" else self.reply_timeout_s
            kwargs.setdefault("timeout", (CONNECT_TIMEOUT_S, reply))
            try:
                return super()._do_request(method, endpoint, **kwargs)
            except requests.exceptions.Timeout as error:
                waited = "connect" if isinstance(error, requests.exceptions.ConnectTimeout) else "answer"
                raise RayUnreachableError(
                    f"the job server at {self._address} did not {waited} within {kwargs['timeout'][0 if waited == 'connect' else 1]:g} s "
                    f"({method} {endpoint}): a server that accepts connections but does not reply (hung, or not a Ray job "
                    "server); check the address (the head's dashboard, ray start --head --dashboard-host ...)"
                ) from None

    return TimedJobClient


def job_client(address: str | None = None):
    """A job client (:func:`timed_job_client_class`) for ``address`` (default: :func:`default_address`)."""
    import ray

    address = address or default_address()
    url = dashboard_url(address)
    token_sent = send_ray_token(address)  # token mode on when a token is at hand: the client then sends it
    try:
        with _explicit_address():
            return timed_job_client_class()(url)
    except ray.exceptions.AuthenticationError as error:
        raise RayUnreachableError(ray_auth_refusal(address, error, token_sent)) from None
    except RayUnreachableError as error:  # a request that timed out
        raise RayUnreachableError(f"--address {address}: {error}") from None
    except (OSError, RuntimeError, ValueError) as error:  # requests' errors are OSErrors
        raise RayUnreachableError(f"--address {address}: the job server at {url} did not answer as one ({error})") from None


NO_AGENT = "No available agent to submit job"
AGENT_WAIT_S = 60.0  # how long a submission waits for a just-started head's job agent


@contextlib.contextmanager
def _job_request(job_id: str) -> Iterator[None]:
    try:
        yield
    except RuntimeError as error:  # the client's way of saying the server refused (unknown id, ...)
        said = re.sub(r"^Request failed with status code \d+: ", "", str(error).strip()).rstrip(".") or type(error).__name__
        raise JobError(f"job {job_id}: {said}") from None


# --- submitting -----------------------------------------------------------------------------------


def job_entrypoint(config: str, set_options: list[str], seeds_option: str | None, many_runs: bool) -> str:
    words = ["python", "-m", "polyrl.cli.main", "run", config, "--no-progress"]
    for option in set_options:
        words += ["--set", option]
    if seeds_option is not None:
        words += ["--seeds", seeds_option]
    if many_runs:
        words.append("--many-runs")
    return shlex.join(words)


def output_overrides(first, workdir: Path) -> tuple[list[str], str]:
    """``--set`` options that pin a relative checkpoint.dir and a local MLflow store to this
    machine's folders, and the tracking URI the job will use."""
    overrides = []
    tracking_uri = resolve_tracking_uri(first.tracking.uri, workdir=workdir)
    if is_local_store(tracking_uri):
        tracking_uri = absolute_tracking_uri(tracking_uri)
        overrides.append(f"tracking.uri={tracking_uri}")
    if not Path(first.checkpoint.dir).is_absolute():
        overrides.append(f"checkpoint.dir={(workdir / first.checkpoint.dir).resolve()}")
    return overrides, tracking_uri


def _relative_config(path: Path, workdir: Path) -> str:
    try:
        return str(path.resolve().relative_to(workdir))
    except ValueError:
        raise ConfigError(
            f"{path}: the YAML must be inside the working folder {workdir}, which is what travels to the cluster "
            "(run polyrl submit from a folder that holds it)"
        ) from None


def submit_job(
    path: str | Path,
    *,
    address: str,
    set_options: list[str] | None = None,
    seeds_option: str | None = None,
    many_runs: bool = False,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    echo: Callable[[str], None] = print,
) -> SubmittedJob:
    """Submit ``polyrl run <path>`` as a Ray job; returns at once with its id."""
    import polyrl

    set_options = list(set_options or [])
    workdir = Path.cwd().resolve()
    configs = load_plan(
        path, set_options=set_options, seeds_option=seeds_option, many_runs=many_runs
    ).configs  # a bad YAML: no job
    first = next(iter(configs.values()))
    config = _relative_config(Path(path), workdir)
    client = job_client(address)
    url = client.get_address()
    overrides, tracking_uri = output_overrides(first, workdir)
    if is_local_store(tracking_uri) and not _is_loopback(url):
        echo(
            f"warning: MLflow store {tracking_uri} is a file on this machine: a job on another machine writes to a file of "
            "that name there; use an MLflow server (tracking.uri: http://host:5000) for a cluster"
        )
    checkpoint_dir = (workdir / first.checkpoint.dir).resolve()  # an absolute checkpoint.dir stays as it is
    acquire_lock(
        checkpoint_dir / first.name, experiment=first.name, command=f"polyrl submit {path}"
    ).release()  # a run in progress: refused now
    entrypoint = job_entrypoint(config, [*set_options, *overrides], seeds_option, many_runs)
    env_vars = worker_env()
    if os.environ.get(
        "RAY_JOB_STOP_WAIT_TIME_S"
    ):  # how long `polyrl jobs stop` lets the run finish its step (Ray's default: 3 s)
        env_vars["RAY_JOB_STOP_WAIT_TIME_S"] = os.environ["RAY_JOB_STOP_WAIT_TIME_S"]
    excludes = WORKING_DIR_EXCLUDES + _inside(checkpoint_dir, workdir)  # checkpoints stay home
    runtime_env = {
        "working_dir": str(workdir),
        "excludes": excludes,
        "env_vars": env_vars,
        "py_modules": [str(Path(polyrl.__file__).resolve().parent)],
    }
    job_id = f"polyrl-{first.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            with _job_request(job_id):
                client.submit_job(
                    entrypoint=entrypoint,
                    submission_id=job_id,
                    runtime_env=runtime_env,
                    metadata={"polyrl.experiment": first.name, "polyrl.config": config, "polyrl.tracking_uri": tracking_uri},
                    entrypoint_num_cpus=num_cpus,
                    entrypoint_num_gpus=num_gpus or None,
                )
            return SubmittedJob(job_id, url, entrypoint, tracking_uri)
        except JobError as error:
            # A head that has just started answers before its job agent is up ("No available
            # agent to submit job, please try again later"): wait for it, within a bound.
            if NO_AGENT not in str(error) or time.monotonic() > deadline:
                raise
            echo(f"waiting for the cluster's job agent at {url} (up to {AGENT_WAIT_S:.0f} s)")
            time.sleep(2.0)


def _inside(folder: Path, workdir: Path) -> list[str]:
    """``folder`` as an exclude pattern of the working folder (anchored at its root), if inside it."""
    try:
        inside = folder.relative_to(workdir)
    except ValueError:
        return []
    return [] if inside == Path(".") else ["/" + str(inside)]


def _is_loopback(url: str) -> bool:
    host = url.split("://", 1)[-1].split("/", 1)[0].rpartition(":")[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


# --- following and stopping -----------------------------------------------------------------------


def job_status(client, job_id: str) -> str:
    with _job_request(job_id):
        return str(client.get_job_status(job_id).value)


def list_jobs(client) -> list[Any]:
    """Every job the cluster knows, oldest first (``JobDetails``)."""
    return sorted(client.list_jobs(), key=lambda job: job.start_time or 0)


def job_logs(client, job_id: str) -> str:
    with _job_request(job_id):
        return client.get_job_logs(job_id)


def follow_logs(client, job_id: str, write: Callable[[str], None]) -> str:
    """Write the job's logs as they come until it ends; its final status."""
    job_status(client, job_id)  # an unknown id is refused before the stream opens

    async def tail() -> None:
        async for lines in client.tail_job_logs(job_id):
            write(lines)

    asyncio.run(tail())
    deadline = time.monotonic() + 30  # the stream closes as the job ends; its status follows within moments
    while (status := job_status(client, job_id)) not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.2)
    return status


def stop_job(client, job_id: str, wait_s: float = 30.0) -> str:
    """Ask the job to stop (Ray sends SIGTERM, then SIGKILL) and wait for it; its final status."""
    with _job_request(job_id):
        client.stop_job(job_id)
    deadline = time.monotonic() + wait_s
    while (status := job_status(client, job_id)) not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.2)
    return status
