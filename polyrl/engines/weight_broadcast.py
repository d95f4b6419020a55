"""Weights from the learner to the rollout workers through a torch.distributed broadcast
(``rollout.weight_sync: broadcast``), as verl and OpenRLHF send them on CUDA clusters. The
group and its rendezvous; the transport that uses them is
:class:`~polyrl.engines.worker_transports.BroadcastTransport`.

The group is a stateless one of its own (a store and a ``ProcessGroupGloo`` /
``ProcessGroupNCCL`` built directly, not ``init_process_group``), so it lives beside any default
group of the processes (the learner ranks' own). On one machine (a driver on 127.0.0.1) the
rendezvous is a ``FileStore`` in a private folder and gloo's sockets are bound to 127.0.0.1, so
nothing listens beyond the machine; across nodes it is a ``TCPStore`` on the driver's node
address (torch binds it to every interface: keep the cluster's network private). Rank 0 is the driver, which holds the learner's
weights that a sync sends (with ``train.learner_workers > 1`` the driver's mirror of learner
rank 0, which takes rank 0's weights after every update); ranks 1 … N are the rollout workers.

A sync sends the tensors' names, shapes and dtypes through Ray (small), then each tensor by one
broadcast from rank 0; every worker receives into fresh tensors on its device and loads them
into its engine with the new policy version. Nothing passes through Ray's object store, so a
CUDA learner's weights go GPU to GPU over NCCL.

Tested here on CPU with gloo (real groups between the driver and Ray actors, tests/workers);
the NCCL path is the same code with another backend and was NOT run (this machine has no GPU).
"""

from __future__ import annotations

import datetime
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

from polyrl.engines.weight_transport import resolve_weight_sync  # rollout.weight_sync's choice, kept importable here
from polyrl.runtime.devices import current_cuda_device

__all__ = ["BroadcastGroup", "Rendezvous", "TensorMeta", "resolve_weight_sync", "tensor_metas"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32", "bfloat16", ...


def tensor_metas(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[TensorMeta]:
    return [TensorMeta(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")) for name, tensor in named_tensors]


@dataclass(frozen=True)
class Rendezvous:
    """Where the group's members meet: a file on this machine, or the driver's TCP port."""

    address: str  # the driver's node address (gloo's sockets bind to it)
    world_size: int
    timeout_s: float
    file: str = ""  # FileStore (one machine)
    port: int = 0  # TCPStore (several nodes)

    @classmethod
    def host(cls, address: str, world_size: int, timeout_s: float) -> tuple["Rendezvous", Any]:
        """Rank 0's side: the rendezvous and its store."""
        import torch.distributed as dist

        if address in LOOPBACK:
            file = str(Path(tempfile.mkdtemp(prefix="polyrl-broadcast-")) / "store")
            return cls(address, world_size, timeout_s, file=file), dist.FileStore(file, world_size)
        store = dist.TCPStore(address, 0, world_size, True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s))
        return cls(address, world_size, timeout_s, port=store.port), store

    def store(self) -> Any:
        """A member's side of the store."""
        import torch.distributed as dist

        if self.file:
            return dist.FileStore(self.file, self.world_size)
        return dist.TCPStore(self.address, self.port, self.world_size, False, timeout=datetime.timedelta(seconds=self.timeout_s))

    def remove(self) -> None:
        if self.file:
            shutil.rmtree(Path(self.file).parent, ignore_errors=True)


class BroadcastGroup:
    """One member of the broadcast group (rank 0 the sender). Rank 0 hosts the rendezvous
    (:meth:`Rendezvous.host`); the workers :meth:`join` it; every member's constructor returns
    once all ``world_size`` have joined."""

    def __init__(self, store: Any, rank: int, rendezvous: Rendezvous, backend: str):
        import torch.distributed as dist

        world_size = rendezvous.world_size
        self.rank, self.world_size, self.backend, self.rendezvous = rank, world_size, backend, rendezvous
        timeout = datetime.timedelta(seconds=rendezvous.timeout_s)
        if backend == "gloo":
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=rendezvous.address)]  # its sockets on that address
            self.group = dist.ProcessGroupGloo(store, rank, world_size, options)
        elif backend == "nccl":  # not run here (no GPU)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(store, rank, world_size, options)
        else:
            raise ValueError(f"broadcast backend {backend!r}; allowed: gloo, nccl")
        self.store = store
        self.device = current_cuda_device() if backend == "nccl" else torch.device("cpu")

    @classmethod
    def join(cls, rendezvous: Rendezvous, rank: int, backend: str) -> "BroadcastGroup":
        return cls(rendezvous.store(), rank, rendezvous, backend)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def send(self, tensors: Iterable[torch.Tensor]) -> int:
        """Rank 0: every tensor, in order, to every member; the bytes sent (per receiver)."""
        sent = 0
        for tensor in tensors:
            tensor = tensor.detach().to(self.device).contiguous()
            self._broadcast(tensor)
            sent += tensor.numel() * tensor.element_size()
        return sent

    def receive(self, metas: list[TensorMeta]) -> list[tuple[str, torch.Tensor]]:
        """Ranks 1 …: the tensors ``metas`` describes, as rank 0 sends them."""
        received = []
        for meta in metas:
            tensor = torch.empty(meta.shape, dtype=getattr(torch, meta.dtype), device=self.device)
            self._broadcast(tensor)
            received.append((meta.name, tensor))
        return received

    def close(self) -> None:
        shutdown = getattr(self.group, "shutdown", None)  # NCCL's communicators; gloo's go with the object
        if shutdown is not None and self.backend == "nccl":
            shutdown()
        self.group = None
        if self.rank == 0:
            self.rendezvous.remove()
