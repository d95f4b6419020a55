"""A local Ray cluster for the data-parallel learner tests of this folder.

Package scope, like tests/workers' cluster: it starts with the first test that asks for it and
shuts down when this folder's tests are done, so tests elsewhere that start their own Ray
(tests/launch) or need another size (tests/workers: 4 CPUs) never meet it.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def ray_local():
    """A real local Ray cluster (2 CPUs: one per learner rank; 127.0.0.1, no dashboard). Its
    workers inherit this process's environment (PYTHONPATH included), so actors import this
    checkout's polyrl."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024 * 1024, log_to_driver=False,
                 _node_ip_address="127.0.0.1", logging_level="ERROR")
    yield ray
    if started:
        ray.shutdown()
