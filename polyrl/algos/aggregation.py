"""Loss aggregation: how per-token losses become one scalar.

Every mode is written as ``sum_t w_t * loss_t / loss_normalizer`` where the per-token weight
``w_t`` depends only on the token's own sequence and ``loss_normalizer`` is computed ONCE per
MINI-BATCH (the samples of one optimizer step: ``train.mini_batches`` splits each rollout batch
into that many) by :func:`global_loss_normalizer`, before the mini-batch's micro-batch loop.
Because the weights are local and the normaliser spans the mini-batch, summing the losses of any
split of the mini-batch into micro-batches (and data-parallel ranks) gives exactly the loss of
the unsplit mini-batch, so 1x8 == 8x1 accumulation. With ``train.mini_batches: 1`` (the default)
the mini-batch is the whole rollout batch; with more, each optimizer step normalises over its
own mini-batch, as verl's and OpenRLHF's PPO mini-batch updates do.

Modes, named for the maths:

- ``token_mean``: ``sum of all token losses / total response tokens`` (DAPO, arXiv 2503.14476).
- ``seq_mean_token_mean``: each sequence's token mean, summed, ``/ number of sequences``
  (GRPO, arXiv 2402.03300).
- ``seq_mean_token_sum``: each sequence's token sum, summed, ``/ number of sequences``.
- ``seq_sum_constant_norm``: ``sum of all token losses / (number of rows * L_max)``
  (Dr.GRPO, arXiv 2503.20783 §3.1: a constant normaliser removes the length bias).

For the two ``seq_mean_*`` modes, "number of sequences" counts rows with at least one loss
token: an all-masked row contributes no loss, so counting it would only shrink the others'
weight. ``seq_sum_constant_norm`` counts *every* row of the mini-batch, masked ones included
(a row whose reward failed to score, a truncated answer under ``mask_truncated``): its
normaliser is the paper's constant, the number of sampled sequences times L_max, so masking a
row changes no other row's weight, as in TRL's ``dr_grpo`` loss and verl's
``seq-mean-token-sum-norm``. (Counting only unmasked rows would make the normaliser shrink as
rows are masked, and with it every remaining token's weight grow.)

With data-parallel training (``train.learner_workers``), each rank computes
:func:`loss_normalizer_count` over its shard, the counts are all-reduced (summed) and clamped to
at least 1, which is the normaliser of the whole global mini-batch; the gradients are then
all-reduced as a sum (if an all-reduce averaged over ``world_size`` ranks instead, the loss would
have to be multiplied by ``world_size``).
"""

from __future__ import annotations

import torch
from torch import Tensor

AGGREGATION_MODES: tuple[str, ...] = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_sum_constant_norm",
)


def check_aggregation_mode(mode: str) -> None:
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; allowed modes: {', '.join(AGGREGATION_MODES)}")


def count_sequences(mask: Tensor) -> int:
    return int(mask.bool().any(dim=-1).sum().item())


def loss_normalizer_count(mask: Tensor, *, mode: str, max_response_length: int | None = None) -> float:
    """The raw denominator of ``mode`` over the rows of ``mask`` [B, T] (possibly 0): a count of
    tokens or sequences (times L_max), so the counts of a mini-batch's parts (data-parallel
    ranks' shards) add up to the whole mini-batch's. See :func:`global_loss_normalizer`."""
    check_aggregation_mode(mode)
    if mode == "token_mean":
        return float(mask.bool().sum().item())
    if mode == "seq_sum_constant_norm":
        # Every row, masked ones too: the paper's constant (see the module docstring).
        length = mask.shape[-1] if max_response_length is None else max_response_length
        return float(mask.shape[0] * length)
    return float(count_sequences(mask))


def global_loss_normalizer(mask: Tensor, *, mode: str, max_response_length: int | None = None) -> float:
    """The denominator of ``mode`` for a whole mini-batch ``mask`` [B, T] (all its micro-batches).

    ``max_response_length`` is the configured generation limit L_max used by
    ``seq_sum_constant_norm``; when omitted the mask's width ``T`` stands in for it, which only
    matches Dr.GRPO when the batch is padded to the generation limit. Returns at least 1.0 so an
    empty batch yields a zero loss rather than a division by zero.
    """
    return max(loss_normalizer_count(mask, mode=mode, max_response_length=max_response_length), 1.0)


def token_weights(mask: Tensor, *, mode: str, dtype: torch.dtype = torch.float32) -> Tensor:
    """Per-token weights ``w_t`` [B, T] of ``mode`` (zero on masked tokens), before the normaliser."""
    check_aggregation_mode(mode)
    mask = mask.bool()
    weights = mask.to(dtype)
    if mode == "seq_mean_token_mean":
        # Clamp avoids 0/0 on all-masked rows; their weights are zero anyway.
        lengths = weights.sum(dim=-1, keepdim=True).clamp(min=1.0)
        weights = weights / lengths
    return weights


def aggregate(per_token_loss: Tensor, mask: Tensor, *, mode: str, loss_normalizer: float) -> Tensor:
    """Scalar loss of ``mode``: ``sum_t w_t * loss_t / loss_normalizer``.

    Masked positions are zeroed with ``torch.where`` first, so NaN or inf there cannot leak
    into the loss or its gradient.
    """
    mask = mask.bool()
    weights = token_weights(mask, mode=mode, dtype=per_token_loss.dtype)
    safe_loss = torch.where(mask, per_token_loss, torch.zeros_like(per_token_loss))
    return (safe_loss * weights).sum() / loss_normalizer
