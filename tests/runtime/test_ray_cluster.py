"""The in-run Ray cluster (runtime/ray_cluster.py): started by the first user when none is
connected, shut down by the last. (A cluster someone else started is left alone: tests/workers run several
pools, each closed, on one cluster their fixture started.)"""

from __future__ import annotations

import pytest

from polyrl.runtime.ray_cluster import acquire_ray, release_ray


@pytest.mark.slow
def test_a_local_cluster_lives_from_the_first_acquire_to_the_last_release():
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    try:
        acquire_ray()  # starts a local cluster on 127.0.0.1
        assert ray.is_initialized()
        assert acquire_ray() is ray  # a second user (e.g. a remote reward beside the rollout workers)
        release_ray()
        assert ray.is_initialized()  # the first user still holds it
        release_ray()
        assert not ray.is_initialized()
        release_ray()  # one release too many is harmless
    finally:
        if ray.is_initialized():
            ray.shutdown()

