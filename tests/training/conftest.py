"""A local Ray cluster for the data-parallel learner tests of this folder.

Module scope: it starts with a module's first test that asks for it and shuts down after that
module. (Package scope is not enough: these folders have no ``__init__.py``, so pytest kept a
"package" cluster to the end of the session, and tests/runtime and tests/workers then met a
2-CPU cluster with a learner-rank placement group still holding its CPUs.)
"""

from __future__ import annotations

import pytest

from tests.ray_support import in_process_cluster


@pytest.fixture(scope="module")
def ray_local():
    """A real local Ray cluster (2 CPUs: one per learner rank)."""
    yield from in_process_cluster(num_cpus=2, object_store_mb=100)
