"""How the learner's weights reach the rollout engine: one class per way, chosen by name.

Every weight sync goes through one place. The loop hands the learner's weights to the collector
(:func:`polyrl.trainer.loop.sync_policy`), the collector to its engine's
:meth:`~polyrl.engines.base.RolloutEngine.update_weights`, and that to the engine's
:class:`WeightTransport`, which carries them to wherever the sampler's weights live and loads
them there as a policy version:

- ``in_process`` (:class:`InProcessReload`): the engine runs in this process and loads them
  itself (:meth:`~polyrl.engines.base.RolloutEngine.sync_weights`: vLLM's in-place reload in its
  worker, :mod:`polyrl.engines.vllm_reload`; the HF engine's ``load_state_dict``). Every engine
  in this process uses it; a rollout worker's engine too, once the weights have reached it.
- ``object_store`` (:class:`~polyrl.engines.worker_transports.ObjectStoreTransport`): rollout
  workers (Ray actors, :mod:`polyrl.engines.worker_pool`) each load the one copy put into Ray's
  object store, which is kept to bring a restarted worker up to date.
- ``broadcast`` (:class:`~polyrl.engines.worker_transports.BroadcastTransport`): rollout workers
  receive them by one torch.distributed broadcast per tensor from this process
  (:mod:`polyrl.engines.weight_broadcast`; NCCL on CUDA, gloo on CPU).

The worker transports are chosen by ``rollout.weight_sync`` (:func:`resolve_weight_sync`); an
in-process engine always uses ``in_process`` unless code names another
(:meth:`~polyrl.engines.base.RolloutEngine.use_weight_transport`). A new way (CUDA IPC handles
to a worker on the learner's GPU, an NCCL group from the learner's rank 0 straight to the
workers) is one subclass registered with :func:`register_weight_transport`, the shape of verl's
``checkpoint_engine`` (a registry of backends behind one abstract sender) and prime-rl's weight
broadcasts (one abstract class, one subclass per transport).

Not a transport here: with ``train.learner_workers > 1`` the driver's mirror copies learner rank
0's weights after every update (:meth:`polyrl.learner.ranks.DataParallelLearner.pull`), and the
transport sends the mirror's; a transport that sends from rank 0 itself would skip that copy.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Iterable, Protocol, TypeVar, runtime_checkable

import torch


@runtime_checkable
class SyncTarget(Protocol):
    """What a transport needs of the engine it serves (a :class:`~polyrl.engines.base.RolloutEngine`;
    a protocol here, not an import: engines/base.py imports this module)."""

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def sync_adapter(self, folder: str) -> None: ...


__all__ = [
    "WEIGHT_TRANSPORTS",
    "InProcessReload",
    "WeightTransport",
    "build_weight_transport",
    "register_weight_transport",
    "resolve_weight_sync",
    "weight_transport_class",
    "weight_transport_names",
]

NamedTensors = Iterable[tuple[str, torch.Tensor]]


class WeightTransport(ABC):
    """Carries the learner's weights to one engine's sampler(s) and loads them there.

    Built for one engine (:func:`build_weight_transport`) and kept by it; :meth:`push` is called
    once per sync, :meth:`close` when the engine closes or takes another transport.
    """

    name: ClassVar[str] = ""
    # True: it sends to the Ray rollout workers of a RolloutWorkerPool; False: to an engine in this
    # process. An engine takes only transports of its own kind (RolloutEngine.has_workers).
    to_workers: ClassVar[bool] = False

    def __init__(self, engine: SyncTarget):
        self.engine = engine

    @abstractmethod
    def push(self, named_tensors: NamedTensors, version: int) -> None:
        """Send ``named_tensors`` (Hugging Face parameter names) so that the sampler generates with
        them from now on, as policy ``version``; returns once they are loaded (or raises)."""

    def push_adapter(self, folder: str, version: int) -> None:
        """Load the PEFT adapter folder ``folder`` on top of the base weights as ``version``
        (``model.lora.sync: adapter``); transports that cannot refuse."""
        raise NotImplementedError(
            f"the {self.name} weight transport sends whole weights, not a LoRA adapter; model.lora.sync: merged sends merged weights"
        )

    @property
    def kept(self) -> Any:
        """A copy of the last weights pushed that a worker which missed the sync can load
        (:meth:`~polyrl.engines.worker_pool.EngineWorker.load_weights`), or None (none kept)."""
        return None

    def close(self) -> None:  # noqa: B027 - transports without resources keep this default
        """Free what the transport holds (a process group, a kept copy)."""


class InProcessReload(WeightTransport):
    """The engine in this process loads the weights itself (its ``sync_weights``: vLLM's in-place
    reload, the HF engine's ``load_state_dict``), or the LoRA adapter (its ``sync_adapter``)."""

    name = "in_process"

    def push(self, named_tensors: NamedTensors, version: int) -> None:
        self.engine.sync_weights(named_tensors)

    def push_adapter(self, folder: str, version: int) -> None:
        self.engine.sync_adapter(folder)


# Transports by name -> a class, or "module:class" imported on first use (the worker transports
# import Ray's helpers; listing or validating names must not).
WEIGHT_TRANSPORTS: dict[str, type[WeightTransport] | str] = {
    "in_process": InProcessReload,
    "object_store": "polyrl.engines.worker_transports:ObjectStoreTransport",
    "broadcast": "polyrl.engines.worker_transports:BroadcastTransport",
}

T = TypeVar("T", bound=type[WeightTransport])


def register_weight_transport(name: str) -> Callable[[T], T]:
    """Class decorator: register a :class:`WeightTransport` subclass as ``name`` (its ``name`` is
    set to it). Registering a taken name is refused: transports are chosen by name in configs."""

    def register(cls: T) -> T:
        if not (isinstance(cls, type) and issubclass(cls, WeightTransport)):
            raise TypeError(f"weight transport {name!r}: {cls!r} is not a WeightTransport subclass")
        if name in WEIGHT_TRANSPORTS and weight_transport_class(name) is not cls:
            raise ValueError(f"weight transport {name!r} is already registered ({WEIGHT_TRANSPORTS[name]})")
        cls.name = name
        WEIGHT_TRANSPORTS[name] = cls
        return cls

    return register


def weight_transport_names() -> list[str]:
    """The registered names, sorted."""
    return sorted(WEIGHT_TRANSPORTS)


def weight_transport_class(name: str) -> type[WeightTransport]:
    """The class registered as ``name``; an unknown name is refused with the allowed ones."""
    if name not in WEIGHT_TRANSPORTS:
        raise ValueError(f"unknown weight transport {name!r}; allowed: {', '.join(weight_transport_names())}")
    entry = WEIGHT_TRANSPORTS[name]
    if isinstance(entry, str):
        module_name, class_name = entry.split(":")
        entry = getattr(importlib.import_module(module_name), class_name)
        entry.name = name
        WEIGHT_TRANSPORTS[name] = entry
    return entry


def build_weight_transport(name: str, engine: SyncTarget) -> WeightTransport:
    """The transport registered as ``name`` for ``engine``; one of the other kind (a worker
    transport for an in-process engine, or the reverse) is refused with the names that fit."""
    cls = weight_transport_class(name)
    has_workers = bool(getattr(engine, "has_workers", False))
    if cls.to_workers != has_workers:
        fitting = [n for n in weight_transport_names() if weight_transport_class(n).to_workers == has_workers]
        where = "Ray rollout workers" if cls.to_workers else "an engine in this process"
        raise ValueError(
            f"weight transport {name!r} sends to {where}, but the {getattr(engine, 'name', type(engine).__name__)} engine "
            f"{'is a pool of rollout workers' if has_workers else 'runs in this process'}; allowed here: {', '.join(fitting)}"
        )
    return cls(engine)


def resolve_weight_sync(setting: str, *, learner_cuda: bool, worker_gpus: float) -> tuple[str, str | None]:
    """``(transport name, broadcast backend)`` for ``rollout.weight_sync``: 'auto' broadcasts over
    NCCL when the learner and the workers are on CUDA, else goes through the object store;
    'broadcast' uses NCCL there and gloo otherwise (CPU: tests, or a CPU cluster); 'object_store',
    or any other registered worker transport, is taken as named (backend None)."""
    on_cuda = learner_cuda and worker_gpus > 0
    if setting == "auto":
        setting = "broadcast" if on_cuda else "object_store"
    worker_names = [n for n in WEIGHT_TRANSPORTS if weight_transport_class(n).to_workers]
    if setting not in worker_names:
        raise ValueError(f"rollout.weight_sync: {setting!r}; allowed: {', '.join(['auto', *worker_names])}")
    if setting == "broadcast":
        return "broadcast", "nccl" if on_cuda else "gloo"
    return setting, None
