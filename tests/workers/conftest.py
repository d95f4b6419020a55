"""A local Ray cluster shared by the rollout-worker and remote-reward tests of this folder.

Package scope: it starts with the first test that asks for it and shuts down when this folder's
tests are done, so tests elsewhere that start their own Ray (tests/launch) never meet it.
"""

from __future__ import annotations

import pytest

from tests.ray_support import in_process_cluster


@pytest.fixture(scope="package")
def ray_cluster():
    # 4 logical CPUs on this 2-core machine: two workers of 1 CPU each, the driver's test and a
    # reward actor fit; nothing runs at once but the step being tested.
    yield from in_process_cluster(num_cpus=4, object_store_mb=200)
