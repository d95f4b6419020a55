"""``polyrl submit``: run the arms of an experiment as Ray tasks.

The driver (the process that runs ``polyrl submit``) resolves the experiment, creates the MLflow
parent run and one child run per arm — params, resolved config and tags logged there, exactly as
``polyrl run`` does — and then hands each arm to a Ray task (``num_cpus=cpus_per_arm``). A task
gets the arm's *resolved config as YAML text* (never a path: the worker may be on another
machine), the tracking URI and its run id; it builds the arm's roles (``train_arm``) with a
:class:`RunLogger` for that run, trains, and marks the run FINISHED (or FAILED). Arms run in
parallel when the cluster has the CPUs (``--sequential`` runs one at a time).

Where Ray runs (``polyrl submit --address`` is a Ray job instead: :mod:`polyrl.launch.ray_jobs`):

* no ``address``: ``ray.init()`` starts (or, with ``RAY_ADDRESS`` set, attaches to) a local
  cluster on 127.0.0.1 with no dashboard; it stops when the command ends. Workers are started
  with this interpreter, so they import the very ``polyrl`` this driver imports.
* ``address`` (``auto``, ``host:port`` or ``ray://host:port``, or ``RAY_ADDRESS``, as inside a
  Ray job): this process joins a running cluster as its driver. The local ``polyrl`` package
  folder travels to the workers in ``runtime_env={"py_modules": [...]}`` so workers run the
  driver's code; its dependencies (torch, transformers, mlflow, vLLM) must be installed on the
  cluster's nodes. Files the YAML names (model folders, data, reward files, ``checkpoint.dir``)
  must be visible on the worker nodes (a shared filesystem).

MLflow: the tracking URI is resolved on the driver and a local store path is made absolute, so
workers on this machine write to the same SQLite file. A multi-node cluster needs an MLflow
tracking server every node reaches (``tracking.uri: http://host:5000`` or
``MLFLOW_TRACKING_URI``); a SQLite file on one node's disk is not shared.

With ``seeds`` (``--seeds``), every arm × seed is one task: the driver creates each arm's run
and each seed's run under it, the tasks spread over the cluster like arms do, and when all
tasks are done the supervisor gives each arm's run the per-step mean over its seeds and closes
it (FAILED if a seed failed).

``start_experiment_run``, ``start_arm_run`` and ``train_arm`` are the steps ``polyrl run``
shares with ``polyrl submit``. What runs inside the cluster (an arm's task, the supervision of the
arms) is in :mod:`polyrl.launch.ray_workers`; the commands are in :mod:`polyrl.cli.submit`.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from rich.console import Console

from polyrl.config.schema import ConfigError, to_yaml
from polyrl.core.errors import PolyrlError
from polyrl.launch.arm_runs import ExperimentResult
from polyrl.launch.arm_steps import start_arm_run, start_experiment_run, yaml_text
from polyrl.launch.experiment_folder import STATE_FILE, archive_previous_run, experiment_dir, write_state
from polyrl.launch.ray_workers import finish_if_running, supervise_arms, worker_env
from polyrl.launch.run_lock import acquire_lock
from polyrl.launch.run_units import expand_units, load_plan, start_seeded_arm_run
from polyrl.launch.units_at_once import with_threads
from polyrl.runtime.ray_cluster import LOCAL_CLUSTER_SYSTEM_CONFIG
from polyrl.tracking.mlflow_runs import ExperimentTracker, probe_tracking, resolve_tracking_uri

RAY_CLIENT_PORT = 10001
ADDRESS_PROBE_TIMEOUT_S = 5.0


RAY_AUTH_PROBE_TIMEOUT_S = 5.0


class RayUnreachableError(PolyrlError):
    """The Ray cluster named by ``--address`` (or ``RAY_ADDRESS``) does not answer."""


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """The host and port ``ray.init(address=...)`` will connect to; None for a local cluster."""
    if address in ("local", ""):
        return None
    if address.startswith("ray://"):
        netloc = address[len("ray://") :].split("/", 1)[0]
        host, sep, port = netloc.rpartition(":")
        if not sep:
            host, port = netloc, str(RAY_CLIENT_PORT)
        if not host or not port.isdigit():
            raise RayUnreachableError(f"--address {address}: expected ray://host:port")
        return host.strip("[]"), int(port)
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address  # how ray.init finds "auto"

        try:
            address = canonicalize_bootstrap_address("auto") or ""
        except (ConnectionError, ValueError) as error:
            raise RayUnreachableError(f"--address auto: no running Ray cluster found on this machine ({error})") from None
        if not address:
            return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise RayUnreachableError(f"--address {address}: expected 'auto', host:port or ray://host:port")
    return host.strip("[]"), int(port)


def probe_ray_address(address: str, timeout: float = ADDRESS_PROBE_TIMEOUT_S) -> None:
    """Fail in seconds when nothing listens at a cluster address; ``ray.init`` would retry for minutes."""
    endpoint = ray_endpoint(address)
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=timeout).close()
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        raise RayUnreachableError(
            f"--address {address}: cannot reach a Ray cluster at {endpoint[0]}:{endpoint[1]} ({reason}; checked within "
            f"{timeout:g} s). Start one (ray start --head) or fix the address; without --address polyrl starts a local cluster"
        ) from None


def check_ray_token(address: str) -> None:
    """Send the token when one is at hand (:func:`send_ray_token`), and refuse in a second, saying
    how to pass it, when the cluster's GCS rejects the connection for want of the right one
    (``ray.init`` would retry ~30 s and then call the cluster unreachable)."""
    sent = send_ray_token(address)
    endpoint = None if address.startswith("ray://") or address == "auto" else ray_endpoint(address)
    if endpoint is None:  # Ray Client (ray://) answers through its own server; auto: Ray turns token mode on itself
        return
    import ray
    from ray._raylet import GcsClient

    try:
        GcsClient(address=f"{endpoint[0]}:{endpoint[1]}").internal_kv_get(
            b"polyrl-auth-probe", None, timeout=RAY_AUTH_PROBE_TIMEOUT_S
        )
    except ray.exceptions.AuthenticationError as error:
        raise RayUnreachableError(ray_auth_refusal(address, error, sent)) from None
    except Exception:  # noqa: BLE001 - anything else is ray.init's to report, as before
        return


def send_ray_token(address: str) -> bool:
    """Turn Ray's token authentication on when a token is at hand; whether one is.

    A Ray head started where ``~/.ray/auth_token`` exists requires that token. ``ray.init`` sends
    it only in token mode, which it turns on by itself for a cluster it finds (``auto``) but never
    for an explicit address, so ``--address host:port`` to such a head failed as unreachable. Like
    ``ray.init("auto")``, a token in ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
    ``~/.ray/auth_token`` now turns token mode on (``RAY_AUTH_MODE``, when set, is left as it is).
    """
    try:
        from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
    except ImportError:  # a Ray without token authentication
        return False
    return maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def ray_auth_refusal(address: str, error: Exception, token_sent: bool) -> str:
    said = getattr(error, "message", None) or str(error).split(". ")[0]  # Ray's own help text is replaced by polyrl's
    sent = (
        "the token polyrl found was refused"
        if token_sent
        else "polyrl found no token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) to send"
    )
    return (
        f"--address {address}: the Ray cluster requires token authentication and {sent} ({said}). Pass the head's token "
        "(its ~/.ray/auth_token, or `ray get-auth-token` there) as RAY_AUTH_TOKEN=<token>, RAY_AUTH_TOKEN_PATH=<file> or in "
        "~/.ray/auth_token on this machine"
    )


# --- what travels to the cluster ----------------------------------------------------------------


def absolute_tracking_uri(uri: str) -> str:
    """Make a local store (``sqlite:///rel.db``, ``file:rel``, a bare path) absolute; others unchanged."""
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :]
        return uri if path.startswith("/") or path == ":memory:" else f"sqlite:///{Path(path).resolve()}"
    if uri.startswith("file:"):
        path = uri[len("file:") :]
        path = path[2:] if path.startswith("//") else path
        return f"file://{Path(path).resolve()}"
    if "://" not in uri:
        return str(Path(uri).resolve())
    return uri


def is_local_store(uri: str) -> bool:
    return uri.startswith(("sqlite:", "file:")) or "://" not in uri


def _runtime_env(ship_package: bool) -> dict[str, Any]:
    env: dict[str, Any] = {"env_vars": worker_env()}
    if ship_package:
        import polyrl

        env["py_modules"] = [str(Path(polyrl.__file__).resolve().parent)]
        env["excludes"] = ["__pycache__", "*.pyc"]
    return env


def submit_experiment(
    path: str | Path,
    *,
    set_options: list[str] | None = None,
    address: str | None = None,
    parallel_arms: bool = True,
    cpus_per_arm: float = 1.0,
    gpus_per_arm: float = 0.0,
    console: Console | None = None,
    seeds_option: str | None = None,
    many_runs: bool = True,
):
    """Submit every arm of an experiment to Ray; returns :class:`polyrl.launch.arm_runs.ExperimentResult`.

    This process is the driver and waits for the arms; ``address`` (or ``RAY_ADDRESS``) connects
    it to a running cluster. To submit and return, see :func:`polyrl.launch.ray_jobs.submit_job`.
    """
    import ray

    console = console or Console()
    if cpus_per_arm <= 0:
        raise ConfigError("--cpus-per-arm must be > 0")
    configs, seeds, rounds, at_once = load_plan(path, set_options=set_options, seeds_option=seeds_option, many_runs=many_runs)
    if rounds is not None:
        # Its arms' tasks run side by side, with no round to decide after: the block would do nothing.
        raise ConfigError(
            f"{path}: until_resolved runs seeds in rounds with a decision after each, which polyrl submit's parallel "
            "tasks do not do; run it with polyrl run (or polyrl submit --address, a Ray job that runs polyrl run)"
        )
    if at_once != "auto":
        # Ray places the tasks: --cpus-per-arm says how many share the machine.
        raise ConfigError(
            f"{path}: seeds_at_once: {at_once} is polyrl run's; polyrl submit runs every arm × seed as a Ray task with "
            "--cpus-per-arm CPUs (1 CPU each: as many at once as the cluster has cores); remove seeds_at_once"
        )
    on_cuda = [arm for arm, config in configs.items() if config.train.device.startswith("cuda")]
    if on_cuda and gpus_per_arm <= 0:
        # Ray hides every GPU from a task that asks for none: the arm would fail on the worker.
        raise ConfigError(
            f"train.device: cuda in arm(s) {', '.join(on_cuda)}, but --gpus-per-arm is {gpus_per_arm:g} "
            "(a Ray task that asks for no GPU sees none); pass --gpus-per-arm 1, or train.device: auto"
        )
    first = next(iter(configs.values()))
    tracking_uri = absolute_tracking_uri(resolve_tracking_uri(first.tracking.uri))
    probe_tracking(tracking_uri)
    remote_cluster = address is not None or bool(os.environ.get("RAY_ADDRESS"))
    if remote_cluster and not ray.is_initialized():
        probe_ray_address(address if address is not None else os.environ["RAY_ADDRESS"])
    if remote_cluster and is_local_store(tracking_uri):
        console.print(
            f"[yellow]warning[/]: MLflow store {tracking_uri} is a local file: fine on a one-node cluster, but workers on "
            "other nodes cannot write to it; use an MLflow server (tracking.uri: http://host:5000)."
        )

    started_ray = False
    if remote_cluster and not ray.is_initialized():
        check_ray_token(address if address is not None else os.environ["RAY_ADDRESS"])
    if not ray.is_initialized():
        try:
            if address is None:
                # A local cluster listens on loopback only, like every polyrl server.
                # Its workers (the arms) keep the driver's priority (LOCAL_CLUSTER_SYSTEM_CONFIG).
                local_only = (
                    {} if remote_cluster else {"_node_ip_address": "127.0.0.1", "_system_config": LOCAL_CLUSTER_SYSTEM_CONFIG}
                )
                ray.init(
                    include_dashboard=False,
                    object_store_memory=200 * 1024 * 1024,
                    runtime_env=_runtime_env(ship_package=remote_cluster),
                    **local_only,
                )
            else:  # the driver's polyrl package travels with the job (py_modules)
                ray.init(address=address, runtime_env=_runtime_env(ship_package=True))
        except ConnectionError as error:
            raise ConfigError(
                f"--address {address or os.environ.get('RAY_ADDRESS')}: cannot reach a Ray cluster: {error}"
            ) from None
        started_ray = True
    try:
        return _submit_connected(
            path,
            configs,
            seeds,
            first,
            tracking_uri,
            parallel_arms=parallel_arms,
            cpus_per_arm=cpus_per_arm,
            gpus_per_arm=gpus_per_arm,
            console=console,
        )
    finally:
        if started_ray:
            ray.shutdown()


def _submit_connected(path, configs, seeds, first, tracking_uri, *, parallel_arms, cpus_per_arm, gpus_per_arm, console):
    folder = experiment_dir(first).resolve()
    # Held while this driver supervises the arms.
    lock = acquire_lock(folder, experiment=first.name, command=f"polyrl submit {path}", echo=console.print)
    try:
        return _submit_locked(
            path,
            configs,
            seeds,
            first,
            tracking_uri,
            folder,
            parallel_arms=parallel_arms,
            cpus_per_arm=cpus_per_arm,
            gpus_per_arm=gpus_per_arm,
            console=console,
        )
    finally:
        lock.release()


def _submit_locked(path, configs, seeds, first, tracking_uri, folder, *, parallel_arms, cpus_per_arm, gpus_per_arm, console):
    import ray

    archive_previous_run(folder)  # as polyrl run: a new run never overwrites an earlier one's checkpoints
    tracker = ExperimentTracker(tracking_uri, first.tracking.experiment or first.name)
    seed_tags = {} if seeds is None else {"polyrl.seeds": ",".join(map(str, seeds))}
    parent = start_experiment_run(
        tracker,
        first.name,
        arms=list(configs),
        yaml_text=yaml_text(path),
        config_path=path,
        tags={"polyrl.launcher": "ray", **seed_tags},
    )
    state_path = folder / STATE_FILE
    state: dict[str, Any] = {
        "tracking_uri": tracking_uri,
        "parent_run_id": parent.run_id,
        "experiment": first.name,
        "config_path": str(path),
        "arms": {},
        "finished": [],
        "launcher": "ray",
        "seeds": seeds,
    }
    if seeds is not None:
        state["runs"] = {}
    jobs: list[dict[str, Any]] = []
    threads = max(1, int(cpus_per_arm))
    try:
        for unit in expand_units(configs, seeds):
            config = with_threads(unit.config, threads)  # torch would otherwise take every core of the node
            arm_run_id = None
            if seeds is not None:
                if unit.arm not in state["arms"]:
                    state["arms"][unit.arm] = start_seeded_arm_run(
                        tracker, parent.run_id, unit.arm, configs[unit.arm], seeds, folder, None, console.print
                    ).run_id
                arm_run_id = state["arms"][unit.arm]
            arm_dir = folder / unit.key
            logger = start_arm_run(tracker, arm_run_id or parent.run_id, unit.arm, config, arm_dir=arm_dir, seed=unit.seed)
            (state["arms"] if seeds is None else state["runs"])[unit.key] = logger.run_id
            jobs.append(
                {
                    "experiment": first.name,
                    "arm": unit.arm,
                    "key": unit.key,
                    "run_id": logger.run_id,
                    "arm_run_id": arm_run_id,
                    "parent_run_id": parent.run_id,
                    "tracking_uri": tracking_uri,
                    "config_yaml": to_yaml(config),
                    "arm_dir": str(arm_dir),
                    "cwd": os.getcwd(),
                }
            )
        write_state(state_path, state)
    except BaseException:
        for arm_run_id in {job["arm_run_id"] for job in jobs if job["arm_run_id"]}:
            finish_if_running(parent.client, arm_run_id, "FAILED")
        parent.finish("FAILED")
        raise

    result = ExperimentResult(
        first.name,
        tracking_uri,
        parent.run_id,
        dict(state["arms"]),
        experiment_dir=folder,
        seeds=seeds,
        seed_run_ids=dict(state.get("runs", {})),
    )
    try:
        task_options = {"num_cpus": cpus_per_arm, "num_gpus": gpus_per_arm, "runtime_env": {"env_vars": worker_env()}}
        cluster_cpus = ray.cluster_resources().get("CPU", 0)
        console.print(
            f"[bold]polyrl[/] submit [cyan]{first.name}[/] · arms: {', '.join(configs)} · "
            + (f"seeds: {', '.join(map(str, seeds))} · " if seeds is not None else "")
            + f"{'parallel' if parallel_arms else 'sequential'}, {cpus_per_arm:g} CPU each (cluster: {cluster_cpus:g} CPUs) · "
            f"MLflow: {tracking_uri}"
        )
        console.print(
            f"parent run {parent.run_id} · "
            + " · ".join(f"{key}: {job_id}" for key, job_id in {job["key"]: job["run_id"] for job in jobs}.items())
        )
        results = supervise_arms(
            jobs,
            parallel=parallel_arms,
            task_options=task_options,
            tracking_uri=tracking_uri,
            parent_run_id=parent.run_id,
            state_path=str(state_path),
            echo=console.print,
        )
        result.final_metrics = {job["key"]: results[job["key"]]["final_metrics"] for job in jobs}
    except BaseException:
        if parent.client.get_run(parent.run_id).info.status == "RUNNING":  # failed before the arms were handed over
            for job in jobs:
                finish_if_running(parent.client, job["run_id"], "FAILED")
                if job["arm_run_id"]:
                    finish_if_running(parent.client, job["arm_run_id"], "FAILED")
            parent.finish("FAILED")
        raise
    return result
