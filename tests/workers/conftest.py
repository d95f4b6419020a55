"""A local Ray cluster shared by the rollout-worker and remote-reward tests of a module.

Module scope, not package scope: these folders have no ``__init__.py``, so a "package" cluster
lived to the end of the session and other folders' tests met it (see tests/training/conftest.py).
"""

from __future__ import annotations

import pytest

from tests.ray_support import in_process_cluster


@pytest.fixture(scope="module")
def ray_cluster():
    # 4 logical CPUs on this 2-core machine: two workers of 1 CPU each, the driver's test and a
    # reward actor fit; nothing runs at once but the step being tested.
    yield from in_process_cluster(num_cpus=4, object_store_mb=200)
