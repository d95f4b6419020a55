"""Rollout workers (``rollout.workers: N``): N rollout engines as Ray actors, one engine to the collector.

:class:`RolloutWorkerPool` is a :class:`~polyrl.engines.base.RolloutEngine`: the collector,
the evaluation hook and ``verify_sync`` use it as they use one in-process engine. Inside, each
worker is an :class:`EngineWorker` actor holding a ``vllm`` or ``hf`` engine, with its own
``num_cpus``/``num_gpus``, placed through one Ray placement group (one bundle per worker).

* **Spreading**: a call's prompts are cut into N contiguous slices (sizes differ by at most
  one); worker k gets slice k with ``first_prompt_index`` set to the slice's start. Engines seed
  each request from its position in the whole batch (engines/base.py, seeding contract), so the
  samples are those one engine would draw, whatever N is.
* **Weight sync** (``rollout.weight_sync``): :meth:`RolloutWorkerPool.update_weights` hands the
  learner's tensors to the worker transport of that name (:mod:`polyrl.engines.worker_transports`:
  ``object_store``, one copy in Ray's object store, kept to bring a restarted worker up to date;
  ``broadcast``, a torch.distributed group from the driver, NCCL on CUDA, gloo on CPU, no copy
  kept), which has every worker load them with the new policy version.
* **Versions**: a worker generates only when its weights are the pool's version; otherwise it
  answers with its version, the pool sends it the current weights and asks again. Every
  completion carries its version and the pool refuses (:class:`StaleSamplesError`) a result
  with any other: a stale sample is never returned silently.
* **Failures**: workers are restartable actors (``max_restarts``); a worker that dies while
  generating is restarted by Ray (its constructor loads the model folder again, version 0), the
  pool brings it to the current version and sends the same slice again. The call returns
  exactly the samples it asked for, each once: a slice's result is taken from one answer only.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from polyrl.core.errors import PolyrlError
from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.engines.base import RolloutEngine, build_rollout_engine
from polyrl.engines.weight_broadcast import BroadcastGroup, Rendezvous, TensorMeta
from polyrl.engines.weight_transport import build_weight_transport
from polyrl.runtime.ray_cluster import acquire_ray, release_ray


class WorkerPoolError(PolyrlError, RuntimeError):
    """The rollout workers cannot do what was asked: no room on the cluster, or a worker that
    kept failing after its restarts."""


class StaleSamplesError(WorkerPoolError):
    """A worker returned samples of a policy version other than the pool's."""


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker runs and what it reserves on the cluster."""

    engine: str  # "vllm" or "hf"
    model_path: str
    options: dict[str, Any] = field(default_factory=dict)  # the engine constructor's keywords
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    placement_strategy: str = "PACK"  # Ray's: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD
    max_restarts: int = 3  # per worker, for the whole run (Ray's actor max_restarts)
    ready_timeout_s: float = 120.0  # how long the placement group may wait for resources (and a broadcast for a worker)
    weight_sync: str = "object_store"  # a worker transport by name (engines/worker_transports.py): or "broadcast"
    broadcast_backend: str = "gloo"  # "nccl" on CUDA

    def bundle(self) -> dict[str, float]:
        """One worker's placement-group bundle (Ray refuses zero-valued entries)."""
        return {key: value for key, value in (("CPU", self.num_cpus), ("GPU", self.num_gpus)) if value > 0}


class EngineWorker:
    """One rollout engine in a Ray actor (the body of the actor class)."""

    def __init__(self, engine: str, model_path: str, options: dict[str, Any], threads: int):
        torch.set_num_threads(threads)  # its share of the node: the CPUs it reserved
        self.engine = build_rollout_engine(engine, model_path, **options)  # type: ignore[arg-type]

    def pid(self) -> int:
        return os.getpid()

    def policy_version(self) -> int:
        return self.engine.policy_version

    def load_weights(self, weights: list[tuple[str, torch.Tensor]], version: int) -> int:
        return self.engine.update_weights(weights, version)

    def join_broadcast(self, rendezvous: Rendezvous, rank: int, backend: str) -> None:
        """Join the driver's weight-broadcast group (leaving a previous one)."""
        self.leave_broadcast()
        self.broadcast = BroadcastGroup.join(rendezvous, rank, backend)

    def receive_weights(self, metas: list[TensorMeta], version: int) -> int:
        """Take part in the driver's broadcast of ``metas`` and load what arrives as ``version``."""
        return self.engine.update_weights(self.broadcast.receive(metas), version)

    def leave_broadcast(self) -> None:
        if getattr(self, "broadcast", None) is not None:
            self.broadcast.close()
            self.broadcast = None

    def generate(
        self, prompts: list[PromptSample], settings: SamplingSettings, version: int
    ) -> tuple[int, list[list[Completion]] | None]:
        """``(version, groups)``; ``(its own version, None)`` without generating when its weights
        are not ``version``: the pool must send the right ones first."""
        if self.engine.policy_version != version:
            return self.engine.policy_version, None
        return version, self.engine.generate(prompts, settings)

    def close(self) -> None:
        self.engine.close()


def contiguous_slices(count: int, parts: int) -> list[tuple[int, int]]:
    """``count`` items cut into at most ``parts`` contiguous, non-empty ``(start, stop)`` slices
    whose sizes differ by at most one (the first ones take the remainder)."""
    size, extra = divmod(count, parts)
    slices, start = [], 0
    for k in range(parts):
        stop = start + size + (1 if k < extra else 0)
        if stop > start:
            slices.append((start, stop))
        start = stop
    return slices


class RolloutWorkerPool(RolloutEngine):
    """``workers`` engines as Ray actors behind the :class:`RolloutEngine` interface."""

    name = "workers"

    def __init__(self, spec: WorkerSpec, workers: int, *, seed: int = 0, tokenizer: Any = None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.spec, self.seed = spec, seed
        self.model_path = spec.model_path
        self.ray = acquire_ray()
        self.workers: list[Any] = []
        self.placement: Any = None
        self.restarts = self.resyncs = self.missed_syncs = self.broadcasts = 0
        try:
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(spec.model_path)
            self.tokenizer = tokenizer
            self._start(workers)
        except BaseException:
            self.close()
            raise

    def _start(self, workers: int) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray, spec = self.ray, self.spec
        self.placement = placement_group([spec.bundle()] * workers, strategy=spec.placement_strategy)
        ready, _ = ray.wait([self.placement.ready()], timeout=spec.ready_timeout_s)
        if not ready:
            raise WorkerPoolError(
                f"rollout.workers: {workers} workers of {spec.bundle()} each (rollout.worker_resources) found no room on the Ray "
                f"cluster within {spec.ready_timeout_s:.0f} s (its resources: {ray.cluster_resources()}); lower "
                "rollout.workers or rollout.worker_resources (num_cpus may be a fraction, e.g. 0.5)"
            )
        actor = ray.remote(EngineWorker)
        threads = max(1, int(spec.num_cpus))
        for k in range(workers):
            options = dict(
                num_cpus=spec.num_cpus,
                num_gpus=spec.num_gpus,
                max_restarts=spec.max_restarts,
                max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement, placement_group_bundle_index=k),
            )
            self.workers.append(actor.options(**options).remote(spec.engine, spec.model_path, dict(spec.options), threads))
        self.pids = ray.get([worker.pid.remote() for worker in self.workers])  # waits until every engine is built

    # -- weights ---------------------------------------------------------------------------------

    # Syncs go through a worker transport (engines/worker_transports.py) named by rollout.weight_sync.
    has_workers = True

    @property
    def weight_transport_name(self) -> str:  # type: ignore[override]
        return self.spec.weight_sync

    def use_weight_transport(self, name: str) -> None:
        build_weight_transport(name, self).close()  # checked before anything changes
        self.spec = dataclasses.replace(self.spec, weight_sync=name)

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.update_weights(named_tensors)

    @property
    def _weights(self) -> Any:
        """The transport's kept copy of the current version's weights (object store), or None."""
        return self._transport.kept if self._transport is not None else None

    @property
    def _group(self) -> BroadcastGroup | None:
        """The broadcast transport's group (rollout.weight_sync: broadcast), once formed."""
        return getattr(self._transport, "group", None)

    def _close_group(self) -> None:
        if self._group is not None:
            self._transport.close()

    def _bring_up_to_date(self, k: int) -> None:
        """Worker ``k`` (restarted, or one that missed a sync) gets the pool's current weights."""
        worker = self.workers[k]
        if self.ray.get(worker.policy_version.remote()) == self.policy_version:
            return
        kept = self._weights
        if kept is None:
            why = (
                f" (rollout.weight_sync: {self.spec.weight_sync} keeps no copy)"
                if self.spec.weight_sync != "object_store"
                else ""
            )
            raise WorkerPoolError(
                f"rollout worker {k} samples with policy version {self.ray.get(worker.policy_version.remote())} "
                f"but the pool holds no weights of version {self.policy_version} to send it{why}"
            )
        self.ray.get(worker.load_weights.remote(kept, self.policy_version))
        self.resyncs += 1

    # -- generation ------------------------------------------------------------------------------

    def generate(
        self, prompts: list[PromptSample], settings: SamplingSettings, *, workers: list[int] | None = None
    ) -> list[list[Completion]]:
        """Every prompt's completions, the prompts cut into contiguous slices over ``workers``
        (default: all of them; :meth:`worker_engine` passes its own). Safe to call from several
        threads for disjoint workers: each actor runs its calls one at a time."""
        if not prompts:
            return []
        ray = self.ray
        chosen = list(range(len(self.workers))) if workers is None else list(workers)
        if settings.seed is None:  # one engine would use its own seed: so do the workers, for every slice
            settings = dataclasses.replace(settings, seed=self.seed)
        slices = contiguous_slices(len(prompts), len(chosen))
        results: dict[int, list[list[Completion]]] = {}
        failures: dict[int, BaseException] = {}
        for _ in range(self.spec.max_restarts + 2):
            todo = [i for i in range(len(slices)) if i not in results]
            if not todo:
                break
            calls = {i: self._generate_slice(chosen[i], prompts, settings, slices[i]) for i in todo}
            for i, call in calls.items():
                k = chosen[i]
                try:
                    version, groups = ray.get(call)
                    if groups is None:  # it missed a sync: send the weights, ask again
                        self._bring_up_to_date(k)
                        continue
                except ray.exceptions.RayActorError as error:
                    # Died (while generating or being re-synced): Ray restarts it; the slice goes
                    # again once it is back with the current weights.
                    failures[i] = error
                    try:
                        self._wait_for_restart(k, error)
                    except ray.exceptions.RayActorError as again:  # died again while being re-synced: the next try
                        failures[i] = again
                    continue
                results[i] = self._checked(k, version, groups, slices[i], settings)
        missing = [i for i in range(len(slices)) if i not in results]
        if missing:
            raise WorkerPoolError(
                f"rollout workers {[chosen[i] for i in missing]} did not return their prompts after "
                f"{self.spec.max_restarts + 2} tries (rollout.worker_resources.max_restarts = "
                f"{self.spec.max_restarts}); last error: {failures.get(missing[0], 'stale weights after every re-sync')}"
            )
        return [group for i in range(len(slices)) for group in results[i]]

    def _generate_slice(self, k: int, prompts: list[PromptSample], settings: SamplingSettings, bounds: tuple[int, int]) -> Any:
        start, stop = bounds
        part = dataclasses.replace(settings, first_prompt_index=settings.first_prompt_index + start)
        return self.workers[k].generate.remote(prompts[start:stop], part, self.policy_version)

    @property
    def worker_count(self) -> int:
        return len(self.workers)

    def worker_engine(self, workers: list[int]) -> "WorkerEngine":
        """These workers alone as an engine (asynchronous training's buffer partitions)."""
        return WorkerEngine(self, workers)

    def _wait_for_restart(self, k: int, error: BaseException) -> None:
        """Wait until Ray has worker ``k`` back (a restart: a new process, counted), then bring it up to date."""
        ray, deadline = self.ray, time.monotonic() + self.spec.ready_timeout_s
        while True:
            try:
                pid = ray.get(self.workers[k].pid.remote(), timeout=max(1.0, deadline - time.monotonic()))
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as again:
                if time.monotonic() > deadline:
                    raise WorkerPoolError(
                        f"rollout worker {k} failed ({type(error).__name__}) and did not come back within "
                        f"{self.spec.ready_timeout_s:.0f} s (rollout.worker_resources.max_restarts = "
                        f"{self.spec.max_restarts}): {again}"
                    ) from error
                time.sleep(0.2)
        if pid != self.pids[k]:
            self.restarts += 1
            self.pids[k] = pid
        self._bring_up_to_date(k)

    def _checked(
        self, k: int, version: int, groups: list[list[Completion]], bounds: tuple[int, int], settings: SamplingSettings
    ) -> list[list[Completion]]:
        """A worker's answer, refused unless it has one group per prompt, all of this version."""
        stale = sorted({c.policy_version for group in groups for c in group} - {self.policy_version}, key=str)
        if version != self.policy_version or stale:
            raise StaleSamplesError(
                f"rollout worker {k} returned samples of policy version(s) {stale or [version]}; the pool is at "
                f"version {self.policy_version}: refusing stale samples"
            )
        if len(groups) != bounds[1] - bounds[0] or any(len(group) != settings.n for group in groups):
            raise WorkerPoolError(
                f"rollout worker {k} returned {[len(g) for g in groups]} samples for {bounds[1] - bounds[0]} "
                f"prompts x {settings.n}"
            )
        return groups

    # -- state -----------------------------------------------------------------------------------

    def worker_metrics(self) -> dict[str, float]:
        """Counters since the start: restarts seen, re-syncs sent, syncs missed (``rollout/workers/*``)."""
        return {
            "rollout/workers/restarts": float(self.restarts),
            "rollout/workers/resyncs": float(self.resyncs),
            "rollout/workers/missed_syncs": float(self.missed_syncs),
        }

    def close(self) -> None:
        ray = getattr(self, "ray", None)
        if ray is None:
            return
        for worker in self.workers:
            try:
                ray.get(worker.close.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a dead worker has nothing to close
                pass
            ray.kill(worker, no_restart=True)
        self.workers = []
        self.close_transport()
        if self.placement is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement)
            self.placement = None
        self.ray = None
        release_ray()


class WorkerEngine:
    """Some workers of a :class:`RolloutWorkerPool` as a rollout engine: it cuts each batch over
    them alone (with the pool's seeding, version checks and restarts); weights, versions and
    closing stay the pool's. ``batches`` counts its generate calls."""

    def __init__(self, pool: RolloutWorkerPool, workers: list[int]):
        self.pool, self.workers = pool, list(workers)
        self.tokenizer = pool.tokenizer
        self.batches = 0

    @property
    def policy_version(self) -> int:
        return self.pool.policy_version

    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]:
        self.batches += 1
        return self.pool.generate(prompts, settings, workers=self.workers)

    def worker_metrics(self) -> dict[str, float]:
        return self.pool.worker_metrics()

    def close(self) -> None:
        """The pool closes its workers."""
