"""The weight transports to Ray rollout workers (``rollout.weight_sync``,
:mod:`polyrl.engines.weight_transport`): each sends a :class:`~polyrl.engines.worker_pool.RolloutWorkerPool`'s
workers the learner's weights and has every worker load them as the new policy version.

- ``object_store``: the weights go into Ray's object store once (``ray.put``) and every worker
  loads them from there. The copy is kept until the next sync, to bring a restarted worker up to
  date. A worker that dies meanwhile misses the sync (counted); the pool brings it up to date
  before it generates again.
- ``broadcast``: as verl and OpenRLHF do on CUDA clusters, this process (rank 0) broadcasts them
  to the workers through a torch.distributed group of its own
  (:mod:`polyrl.engines.weight_broadcast`; NCCL on CUDA, gloo on CPU). No host copy: a worker
  restarted mid-step cannot be brought up to date before the next sync, and the step fails with
  that said; the group is formed again (restarted workers included) at the next sync.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.engines.weight_broadcast import BroadcastGroup, Rendezvous, tensor_metas
from polyrl.engines.weight_transport import NamedTensors, WeightTransport
from polyrl.engines.worker_pool import WorkerPoolError

if TYPE_CHECKING:
    from polyrl.engines.worker_pool import RolloutWorkerPool

__all__ = ["BroadcastTransport", "ObjectStoreTransport"]


class ObjectStoreTransport(WeightTransport):
    """One copy in Ray's object store, loaded by every worker; the copy is kept (:attr:`kept`)."""

    name = "object_store"
    to_workers = True
    engine: RolloutWorkerPool

    def __init__(self, engine: RolloutWorkerPool):
        super().__init__(engine)
        self._weights: Any = None  # the object-store copy of the last version pushed

    @property
    def kept(self) -> Any:
        return self._weights

    def push(self, named_tensors: NamedTensors, version: int) -> None:
        pool = self.engine
        ray = pool.ray
        weights = [(name, tensor.detach().to("cpu").contiguous()) for name, tensor in named_tensors]
        self._weights = ray.put(weights)
        pool.policy_version = version  # a worker that misses the loads below is brought to it
        loads = [worker.load_weights.remote(self._weights, version) for worker in pool.workers]
        for load in loads:
            try:
                ray.get(load)
            except ray.exceptions.RayActorError:
                pool.missed_syncs += 1

    def close(self) -> None:
        self._weights = None


class BroadcastTransport(WeightTransport):
    """One broadcast per tensor from this process (rank 0) to the workers (ranks 1 … N) over a
    group of their own, formed on the first sync and again after a worker restarted."""

    name = "broadcast"
    to_workers = True
    engine: RolloutWorkerPool

    def __init__(self, engine: RolloutWorkerPool):
        super().__init__(engine)
        self.group: BroadcastGroup | None = None
        self._group_pids: list[int] = []  # the worker processes in it

    def push(self, named_tensors: NamedTensors, version: int) -> None:
        pool = self.engine
        weights: list[tuple[str, torch.Tensor]] = list(named_tensors)
        pool.policy_version = version
        try:
            group = self._form_group()
            loads = [worker.receive_weights.remote(tensor_metas(weights), version) for worker in pool.workers]
            group.send(tensor for _, tensor in weights)
            pool.ray.get(loads)
        except Exception as error:  # noqa: BLE001 - a worker that died mid-broadcast, or a group that timed out
            self.close()
            pool.missed_syncs += 1
            raise WorkerPoolError(
                f"rollout.weight_sync: broadcast of policy version {version} to the rollout workers failed "
                f"({type(error).__name__}: {error}); the group is formed again at the next sync"
            ) from error
        pool.broadcasts += 1

    def _form_group(self) -> BroadcastGroup:
        """The group of this process and the workers' current processes (again after a restart)."""
        pool = self.engine
        if self.group is not None and self._group_pids == pool.pids:
            return self.group
        self.close()
        ray, spec, size = pool.ray, pool.spec, len(pool.workers) + 1
        rendezvous, store = Rendezvous.host(ray.util.get_node_ip_address(), size, spec.ready_timeout_s)
        joins = [worker.join_broadcast.remote(rendezvous, k + 1, spec.broadcast_backend) for k, worker in enumerate(pool.workers)]
        try:
            self.group = BroadcastGroup(store, 0, rendezvous, spec.broadcast_backend)  # returns once all joined
            ray.get(joins)
        except BaseException:
            rendezvous.remove()
            raise
        self._group_pids = list(pool.pids)
        return self.group

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
