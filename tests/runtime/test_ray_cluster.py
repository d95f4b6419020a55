"""The in-run Ray cluster (runtime/ray_cluster.py): started by the first user when none is
connected, shut down by the last. (A cluster someone else started is left alone: tests/workers run several
pools, each closed, on one cluster their fixture started.)"""

from __future__ import annotations

import pytest

from polyrl.runtime.ray_cluster import acquire_ray, release_ray

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.ray]


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


@pytest.mark.slow
def test_a_local_cluster_runs_its_actors_at_the_drivers_priority():
    """Ray starts workers at nice 15; on a cluster polyrl starts, the workers are the run's own
    rollouts and rewards beside the learner (the driver), so they keep the driver's priority.
    Before: os.nice(0) in a task returned 15 here."""
    import os

    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    try:
        acquire_ray()

        @ray.remote(num_cpus=0)
        def niceness() -> int:
            return os.nice(0)

        assert ray.get(niceness.remote()) == os.nice(0)
    finally:
        release_ray()
        if ray.is_initialized():
            ray.shutdown()


def test_a_run_that_cannot_fit_the_cluster_is_refused_naming_each_part_and_the_total():
    from polyrl.runtime.ray_cluster import RayDemand, RayRoomError, check_room, local_cluster_cpus

    demand = RayDemand(
        (("rollout.workers 2 × rollout.worker_resources", 2.0, 0.0), ("train.learner_workers 2 × train.threads 1", 2.0, 0.0))
    )
    assert (demand.cpus, demand.gpus) == (4.0, 0.0)
    # A local cluster gets the machine's cores, or the demand rounded up when larger: 2 cores, 4 CPUs asked -> 4;
    # 1.5 asked -> 2 (the cores); 2.5 asked -> 3.
    assert [local_cluster_cpus(cpus, cores=2) for cpus in (4.0, 1.5, 2.5)] == [4, 2, 3]
    check_room({"CPU": 4.0}, demand)  # fits exactly
    with pytest.raises(RayRoomError) as refused:
        check_room({"CPU": 2.0, "memory": 1e9}, demand)
    assert str(refused.value).startswith(
        "this run asks the Ray cluster for 4 CPU in all (rollout.workers 2 × rollout.worker_resources: 2 CPU; train.learner_workers "
        "2 × train.threads 1: 2 CPU), but the cluster has 2 CPU in all"
    )
    with pytest.raises(RayRoomError, match=r"asks the Ray cluster for 1 CPU, 2 GPU in all .* has 8 CPU in all"):
        check_room({"CPU": 8.0}, RayDemand((("train.learner_workers 2 × train.threads 1", 1.0, 2.0),)))


@pytest.mark.slow
def test_a_local_cluster_is_sized_for_the_run_and_a_small_one_refuses_it_at_once():
    import os
    import time

    from polyrl.runtime.ray_cluster import RayDemand, RayRoomError

    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    cores = os.cpu_count() or 1
    demand = RayDemand(
        (
            ("rollout.workers 2 × rollout.worker_resources", float(cores), 0.0),
            ("train.learner_workers 2 × train.threads 1", 2.0, 0.0),
        )
    )
    try:
        acquire_ray(demand)  # two learner ranks and workers of all the cores: more CPUs than this machine's
        assert ray.cluster_resources()["CPU"] == cores + 2
        release_ray()
        assert not ray.is_initialized()
        # A cluster someone started with 2 CPUs: refused in moments, where a placement group would wait for minutes.
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR", _node_ip_address="127.0.0.1")
        started = time.monotonic()
        with pytest.raises(RayRoomError, match=rf"for {cores + 2} CPU in all .* has 2 CPU in all"):
            acquire_ray(demand)
        assert time.monotonic() - started < 10 and ray.is_initialized()  # not its cluster: left up
    finally:
        if ray.is_initialized():
            ray.shutdown()
