"""Local Ray clusters for the tests: one in-process cluster per test folder, and the stop of a
foreground ``ray start --head --block`` process. Shared so every folder starts and stops Ray
the same way (127.0.0.1, no dashboard, quiet, a bounded object store)."""

from __future__ import annotations

import shutil
import signal
import subprocess
from typing import Any, Iterator

import pytest

from polyrl.runtime.ray_cluster import LOCAL_CLUSTER_SYSTEM_CONFIG


def in_process_cluster(*, num_cpus: int, object_store_mb: int) -> Iterator[Any]:
    """Yields the ``ray`` module with a fresh local cluster up; shuts it down afterwards. Workers
    inherit this process's environment (PYTHONPATH included), so actors import this checkout's
    polyrl."""
    ray = pytest.importorskip("ray")
    # A cluster left connected by an earlier test has another size and maybe placement groups
    # holding its CPUs: never reuse it, start this module's own.
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        object_store_memory=object_store_mb * 1024 * 1024,
        log_to_driver=False,
        logging_level="ERROR",
        _node_ip_address="127.0.0.1",
        # Workers at the driver's priority, as on the clusters polyrl starts: at Ray's nice 15 they
        # got a sliver of a core beside the other test workers (docs/testing.md).
        _system_config=LOCAL_CLUSTER_SYSTEM_CONFIG,
    )
    try:
        yield ray
    finally:
        ray.shutdown()


# For a ``ray start --head`` process: its workers at the test's priority (see in_process_cluster).
FAIR_WORKERS_ENV = {"RAY_worker_niceness": "0"}


def stop_blocking_head(head: subprocess.Popen, temp_dir: Any) -> None:
    """SIGTERM to a ``ray start --head --block`` process (it stops the processes it started),
    a kill if it has not exited within a minute, then its temp folder removed."""
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        head.kill()
    shutil.rmtree(temp_dir, ignore_errors=True)
