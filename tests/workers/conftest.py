"""A local Ray cluster shared by the rollout-worker and remote-reward tests of this folder.

Package scope: it starts with the first test that asks for it and shuts down when this folder's
tests are done, so tests elsewhere that start their own Ray (tests/launch) never meet it.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def ray_cluster():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        # 4 logical CPUs on this 2-core machine: two workers of 1 CPU each, the driver's test and a
        # reward actor fit; nothing runs at once but the step being tested.
        ray.init(num_cpus=4, include_dashboard=False, object_store_memory=200 * 1024 * 1024, log_to_driver=False,
                 logging_level="ERROR", _node_ip_address="127.0.0.1")
    yield ray
    if started:
        ray.shutdown()
