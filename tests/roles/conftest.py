"""A local Ray cluster for the data-parallel learner tests of this folder.

Package scope, like tests/workers' cluster: it starts with the first test that asks for it and
shuts down when this folder's tests are done, so tests elsewhere that start their own Ray
(tests/launch) or need another size (tests/workers: 4 CPUs) never meet it.
"""

from __future__ import annotations

import pytest

from tests.ray_support import in_process_cluster


@pytest.fixture(scope="package")
def ray_local():
    """A real local Ray cluster (2 CPUs: one per learner rank)."""
    yield from in_process_cluster(num_cpus=2, object_store_mb=100)
