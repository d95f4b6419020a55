"""The collective operations a data-parallel learner needs, behind one small interface.

The policy learner and the critic call these at the few places where a rank's work must be
combined with the others' (:mod:`polyrl.learner.policy_learner`, :mod:`polyrl.learner.critic`):

- :meth:`shard`: this rank's rows of a mini-batch (every rank holds the whole learner batch and
  cuts the same mini-batches from the same seeded shuffle, so they agree on which rows exist);
- :meth:`sum`: a float summed over the ranks: the loss normaliser's raw count (tokens or
  sequences, :func:`polyrl.algos.aggregation.loss_normalizer_count`), so that every rank divides
  by the count of the *global* mini-batch, and the mini-batch loss the non-finite guard checks;
- :meth:`reduce_gradients`: gradients summed over the ranks before clipping, so the clip uses
  the global norm and each rank applies the same step (a sum, not a mean: the normaliser is
  already global, so the per-rank losses add up to the single-process loss);
- :meth:`merge_sums`: the token-weighted metric sums of every rank, added;
- :meth:`gather`: every rank's object (the metric accumulators, combined by the learner);
- :meth:`most`: the largest of an integer over the ranks (the micro-batch count every rank runs
  with FSDP2, whose forwards and backwards are collectives).

:func:`through_root` runs a computation inside an FSDP2 root module's forward, so that the
root's hooks (gather its own parameters, register the backward's reduction) run around it.

:class:`LocalGroup` (one process, today's learner) does nothing at each of them.
:class:`TorchDistributedGroup` does them with ``torch.distributed`` (gloo on CPU, NCCL on CUDA)
over the default process group. With FSDP2 (``fully_shard``) the gradients are already
reduce-scattered by the backward, so :meth:`reduce_gradients` leaves them alone, and the norm of
sharded (DTensor) gradients is computed over the whole model by ``clip_grad_norm_``. That path
runs in the suite over gloo on the CPU with two processes (tests/training/test_learner_fsdp.py: the
same update as one process); on CUDA (NCCL) it is experimental, not yet run on a GPU.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from polyrl.runtime.devices import current_cuda_device

__all__ = ["LocalGroup", "TorchDistributedGroup", "balanced_shard", "through_root"]


def balanced_shard(rows: Tensor, lengths: Tensor, rank: int, world_size: int) -> Tensor:
    """``rank``'s rows of ``rows``: longest first, dealt round-robin, so that ranks get similar
    token counts (a rank's step waits for the slowest). Any partition gives the same update
    (the normaliser is global); this one only balances the work."""
    order = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
    return order[rank::world_size]


_ROUTED = object()  # the argument that marks through_root's call of the root's forward


def through_root(model: torch.nn.Module, compute: Callable[[], Any]) -> Any:
    """``compute()``, run inside ``model``'s forward where ``model`` is an FSDP2 module (else
    directly). The learner reads log-probs through the decoder and the output head rather than
    the model's forward (only the response positions' logits); called directly, those would skip
    the root's pre-forward, which gathers the parameters the root itself holds (embeddings, final
    norm, head) and sets up the reduction of their gradients in the backward. Here the root's
    hooks run around ``compute`` as around any forward; a call of ``model(...)`` inside it is the
    model's own forward."""
    if not torch.distributed.is_available():
        return compute()
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        return compute()
    own_forward = type(model).forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and args[0] is _ROUTED and not kwargs:
            return compute()
        return own_forward(model, *args, **kwargs)

    model.forward = forward  # an instance attribute: nn.Module.__call__ runs the hooks, then this
    try:
        return model(_ROUTED)
    finally:
        del model.forward


class LocalGroup:
    """One process: every collective is the identity."""

    rank = 0
    world_size = 1
    shards_parameters = False

    def shard(self, rows: Tensor, lengths: Tensor) -> Tensor:
        return rows

    def sum(self, value: float) -> float:
        return value

    def reduce_gradients(self, parameters: Iterable[Tensor]) -> None:
        return None

    def clip_grad_norm(self, parameters: Iterable[Tensor], max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(list(parameters), max_norm))

    def merge_sums(
        self, sums: dict[str, float], weights: dict[str, float], extra: float
    ) -> tuple[dict[str, float], dict[str, float], float]:
        return sums, weights, extra

    def gather(self, value: Any) -> list[Any]:
        return [value]

    def most(self, value: int) -> int:
        return value


class TorchDistributedGroup(LocalGroup):
    """The default ``torch.distributed`` process group (already initialised by the caller).

    ``shards_parameters``: the model's parameters are FSDP2 shards (CUDA), whose gradients the
    backward has already reduced; otherwise each rank holds the whole model (CPU, gloo) and the
    gradients are summed here in one flat all-reduce.
    """

    def __init__(self, *, shards_parameters: bool = False):
        import torch.distributed as dist

        self.dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.shards_parameters = shards_parameters
        self.device = current_cuda_device() if dist.get_backend() == "nccl" else torch.device("cpu")

    def shard(self, rows: Tensor, lengths: Tensor) -> Tensor:
        return balanced_shard(rows, lengths, self.rank, self.world_size)

    def sum(self, value: float) -> float:
        # float64: token counts and losses add exactly as they would in one process.
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.SUM)
        return float(tensor.item())

    def reduce_gradients(self, parameters: Iterable[Tensor]) -> None:
        if self.shards_parameters:
            return None  # FSDP2's backward reduce-scatters the gradients (summed, see runtime/fsdp.shard_model)
        params = [p for p in parameters if p.requires_grad]
        # A parameter no rank reached keeps no gradient, as in one process (AdamW then skips it:
        # no state, no weight decay); one that some rank reached counts as zeros on the others
        # (e.g. a rank whose shard of the mini-batch is empty ran no backward).
        reached = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=self.device)
        self.dist.all_reduce(reached, op=self.dist.ReduceOp.SUM)
        params = [p for p, count in zip(params, reached.tolist()) if count > 0]
        if not params:
            return None
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.dist.all_reduce(flat, op=self.dist.ReduceOp.SUM)
        offset = 0
        for p, g in zip(params, grads):
            p.grad = flat[offset : offset + g.numel()].view_as(p).clone()
            offset += g.numel()

    def clip_grad_norm(self, parameters: Iterable[Tensor], max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
        full = getattr(norm, "full_tensor", None)  # FSDP2: a DTensor norm over all shards
        return float(full() if full is not None else norm)

    def gather(self, value: Any) -> list[Any]:
        gathered: list = [None] * self.world_size
        self.dist.all_gather_object(gathered, value)
        return gathered

    def most(self, value: int) -> int:
        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MAX)
        return int(tensor.item())

    def merge_sums(
        self, sums: dict[str, float], weights: dict[str, float], extra: float
    ) -> tuple[dict[str, float], dict[str, float], float]:
        gathered: list = [None] * self.world_size
        self.dist.all_gather_object(gathered, (dict(sums), dict(weights), extra))
        merged_sums: dict[str, float] = {}
        merged_weights: dict[str, float] = {}
        for part_sums, part_weights, _ in gathered:
            for key, value in part_sums.items():
                merged_sums[key] = merged_sums.get(key, 0.0) + value
            for key, value in part_weights.items():
                merged_weights[key] = merged_weights.get(key, 0.0) + value
        return merged_sums, merged_weights, sum(part[2] for part in gathered)
