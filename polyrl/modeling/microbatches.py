"""Micro-batches that compute little padding: rows sorted by length, padding columns dropped.

A mini-batch (one optimizer step) is cut into micro-batches whose gradients accumulate. Packed
rows are right-padded to the longest row of the *whole* rollout batch; a micro-batch of short
rows would forward those pad columns for nothing (a third of the positions computed at the
30m bench). Two exact changes: rows are grouped longest-first so that a micro-batch holds rows
of similar length, and each micro-batch drops the columns that are padding in all its rows.
Neither changes the loss: the normaliser spans the mini-batch and is computed before the split
(:func:`polyrl.algos.aggregation.global_loss_normalizer`, with the configured length limit),
and a masked column contributes zero. Peers do the same: TRL and OpenRLHF trim each micro-batch
to its longest row; verl sorts/balances sequences by length (``use_dynamic_bsz``).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Sequence

import torch
from torch import Tensor

from polyrl.modeling.batches import PackedBatch

__all__ = ["length_sorted_micro_batches", "token_budget_micro_batches", "trim_padding", "trim_columns"]

SEQUENCE_FIELDS = ("input_ids", "attention_mask")
RESPONSE_FIELDS = ("response_mask", "response_index", "completion_ids", "sampling_logprobs")


def length_sorted_micro_batches(rows: Tensor, lengths: Tensor, size: int) -> list[Tensor]:
    """``rows`` (indices into the batch) in micro-batches of ``size``, longest rows first.

    A stable sort keeps the given order among rows of equal length.
    """
    order = torch.argsort(lengths[rows], descending=True, stable=True)
    return list(torch.split(rows[order], size))


def token_budget_micro_batches(
    rows: Tensor, lengths: Tensor, max_rows: int, max_tokens: int, padded: bool = True
) -> list[Tensor]:
    """``rows`` longest first, in micro-batches of at most ``max_rows`` rows whose computed
    positions (rows × the micro-batch's longest row, padding included) stay within ``max_tokens``;
    with ``padded=False`` (padding-free forwards, :mod:`polyrl.modeling.packing`) the rows' own lengths.

    Short rows then share one larger forward instead of several small ones, whose matmuls run
    further from the machine's peak; long rows get fewer per micro-batch, which bounds memory.
    verl's ``use_dynamic_bsz`` (``ppo_max_token_len_per_gpu``) batches by tokens the same way.
    A row longer than the budget goes alone. Exact, like the count-based split: the loss
    normaliser spans the mini-batch.
    """
    order = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
    batches: list[list[int]] = []
    width = used = 0
    for row in order.tolist():
        length = int(lengths[row])
        cost = (len(batches[-1]) + 1) * width if padded and batches else used + length
        if batches and len(batches[-1]) < max_rows and cost <= max_tokens:
            batches[-1].append(row)
            used += length
        else:
            batches.append([row])
            width = used = length  # longest first: the first row sets the micro-batch's width
    return [torch.as_tensor(batch, dtype=rows.dtype) for batch in batches]


def trim_padding(packed: PackedBatch) -> PackedBatch:
    """``packed`` without the trailing columns that are padding in every row.

    Sequence tensors keep the longest real row (prompt + completion), response tensors the
    longest completion (at least one column). ``response_index`` points inside the kept columns
    because rows are right-padded.
    """
    seq = max(1, int(packed.attention_mask.sum(dim=1).max()))
    # The last response column in use (an episode's mask has holes: its sum is not its width).
    used = packed.response_mask.bool().any(dim=0).nonzero()
    resp = max(1, int(used.max()) + 1 if len(used) else 1)
    trimmed = {}
    for f in fields(packed):
        value = getattr(packed, f.name)
        if value is not None and f.name in SEQUENCE_FIELDS:
            value = value[:, :seq]
        elif value is not None and f.name in RESPONSE_FIELDS:
            value = value[:, :resp]
        trimmed[f.name] = value
    return PackedBatch(**trimmed)


def trim_columns(width: int, tensors: Sequence[Tensor | None]) -> list[Tensor | None]:
    """Per-token ``[B, T]`` tensors cut to ``width`` columns; per-sequence ``[B]`` ones and None as they are."""
    return [t[:, :width] if t is not None and t.dim() == 2 else t for t in tensors]
