"""The Ray cluster that in-run actors (rollout workers, remote reward modules) live on.

Inside ``polyrl submit`` (or after the caller's own ``ray.init``) Ray is already connected and the
actors join that cluster. Otherwise the first user starts a local one, bound to 127.0.0.1 like
every polyrl server (or attaches to ``RAY_ADDRESS``), and the last user to release it shuts it
down: a run leaves no Ray processes behind.

A run states what it will reserve (:class:`RayDemand`: rollout workers, learner ranks, remote
reward actors) when it first acquires Ray. A local cluster started then gets enough logical CPUs
for it (:func:`local_cluster_cpus`: the machine's cores, or the demand when larger; Ray's CPUs
are scheduling units, so the actors then share the cores rather than wait for each other's
placement group forever). A cluster that is already there is checked instead
(:func:`check_room`): a demand beyond its total resources is refused at once, naming each part
and the cluster's resources, where a placement group would wait for its timeout. Worker output goes to Ray's session log folder, not
to the terminal (``log_to_driver=False``); errors still reach the driver as exceptions.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from typing import Any

from polyrl.core.errors import PolyrlError

# Ray starts its worker processes at nice 15, below the driver, so that a shared head stays
# responsive. On a cluster polyrl starts itself (for one run, or one local ``polyrl submit``) the
# workers are the work: rollout engines and reward actors beside the learner, which is the
# driver, or the arms themselves. At nice 15 they get a sliver of a core whenever the learner
# computes (asynchronous training, ``rollout.max_staleness``) or anything else runs on the machine,
# so they keep the driver's priority. A cluster someone else started keeps its own setting.
LOCAL_CLUSTER_SYSTEM_CONFIG: dict[str, Any] = {"worker_niceness": 0}

_lock = threading.Lock()
_users = 0  # acquire_ray calls not yet released, counted only for a cluster started here
_started_here = False


class RayRoomError(PolyrlError):
    """The run asks the Ray cluster for more than it has in all."""


@dataclass(frozen=True)
class RayDemand:
    """What a run reserves on the Ray cluster: ``(what, CPUs, GPUs)`` per part, ``what`` naming
    the settings that ask for it (e.g. ``rollout.workers 2 × rollout.worker_resources``)."""

    parts: tuple[tuple[str, float, float], ...] = ()

    @property
    def cpus(self) -> float:
        return sum(part[1] for part in self.parts)

    @property
    def gpus(self) -> float:
        return sum(part[2] for part in self.parts)

    def describe(self) -> str:
        return "; ".join(f"{what}: {_resources(cpus, gpus)}" for what, cpus, gpus in self.parts)


def _resources(cpus: float, gpus: float) -> str:
    return f"{cpus:g} CPU" + (f", {gpus:g} GPU" if gpus else "")


def local_cluster_cpus(demand_cpus: float, cores: int) -> int:
    """Logical CPUs of a local cluster started for a run: the machine's cores, or the run's
    demand (rounded up) when larger."""
    return max(cores, math.ceil(demand_cpus - 1e-9))


def check_room(total: dict[str, float], demand: RayDemand) -> None:
    """Refuse a ``demand`` beyond the cluster's ``total`` resources (``ray.cluster_resources()``):
    its placement groups could never be placed."""
    have_cpus, have_gpus = float(total.get("CPU", 0.0)), float(total.get("GPU", 0.0))
    if demand.cpus <= have_cpus + 1e-9 and demand.gpus <= have_gpus + 1e-9:
        return
    raise RayRoomError(
        f"this run asks the Ray cluster for {_resources(demand.cpus, demand.gpus)} in all ({demand.describe()}), but the cluster has "
        f"{_resources(have_cpus, have_gpus)} in all: lower rollout.workers or train.learner_workers, give fractions "
        "(rollout.worker_resources.num_cpus: 0.5, a reward's remote.num_cpus: 0.5), or add nodes"
    )


def acquire_ray(demand: RayDemand | None = None) -> Any:
    """The ``ray`` module, connected; starts a local cluster (sized for ``demand``) if none is
    connected, else checks ``demand`` against the cluster's resources. Pair every call with
    :func:`release_ray` (also when it raises, it holds nothing)."""
    global _users, _started_here
    import ray

    with _lock:
        if not ray.is_initialized():
            local = not os.environ.get("RAY_ADDRESS")
            options: dict[str, Any] = (
                {"_node_ip_address": "127.0.0.1", "_system_config": LOCAL_CLUSTER_SYSTEM_CONFIG} if local else {}
            )
            if local and demand is not None and demand.parts:
                options["num_cpus"] = local_cluster_cpus(demand.cpus, os.cpu_count() or 1)
            ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", **options)
            _started_here, _users = True, 0
        if demand is not None:
            try:
                check_room(ray.cluster_resources(), demand)
            except RayRoomError:
                if _started_here and _users == 0:
                    _started_here = False
                    ray.shutdown()
                raise
        if _started_here:
            _users += 1
    return ray


def release_ray() -> None:
    """One user is done; the last user of a cluster started by :func:`acquire_ray` shuts it down."""
    global _users, _started_here
    import ray

    with _lock:
        if not _started_here:
            return
        _users -= 1
        if _users <= 0:
            _started_here, _users = False, 0
            if ray.is_initialized():
                ray.shutdown()
