"""One forward of a prompt for all the completions sampled from it (``train.share_prompts``).

A GRPO-style batch has G completions per prompt, and the learner's forward runs each row
``prompt + completion`` on its own, so every prompt token is computed G times, in the forward
and in the backward. Under causal attention a prompt's hidden states do not depend on what
follows them, so that work is redundant. Here the rows of a micro-batch that share a prompt
become one packed row::

    prompt | completion 1 | completion 2 | ... | completion G | padding

with each completion's positions continuing from the end of the prompt (``position_ids``) and
a 4-D attention mask that lets a completion token see the prompt and the earlier tokens of its
own completion only. Every completion token then attends to exactly the keys and values it
would see in its own row, at the same positions, so its log-prob is the same up to float
rounding (the attention sums run over the same terms). The gradient of the shared prompt is the
sum over the G completions that read it, which is what G separate rows give too.

From: Liu et al., "Prefix Grouper: Efficient GRPO Training through Shared-Prefix Forward"
(arXiv 2506.05433, 2025). Deviations:

* the paper splits attention into a prefix part and a suffix part; here one packed row with a
  4-D mask is handed to the model's own attention (``sdpa`` or ``eager``), so no model code is
  patched and any decoder that takes ``position_ids`` and a 4-D mask works;
* rows are grouped by equal prompt token ids within a micro-batch (no group ids needed); a
  micro-batch that cuts a group simply shares less;
* the attention of a packed row is over ``P + ΣT`` positions instead of G rows of ``P + T``:
  more attention work for long completions, where the saving on the prompt is small anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from polyrl.core.errors import PolyrlError

__all__ = ["SharePromptsError", "SharedPromptRows", "prompt_group_ids", "prompt_grouped_micro_batches", "share_prompts", "shared_prompt_hidden",
           "sharing_refusal"]


class SharePromptsError(PolyrlError):
    """``train.share_prompts`` cannot apply to this policy."""


@dataclass
class SharedPromptRows:
    """The packed rows of one micro-batch and where each original completion token's predicting
    position lies in them."""

    input_ids: Tensor  # [R, L] packed rows, right-padded
    position_ids: Tensor  # [R, L]
    allowed: Tensor  # [R, L, L] bool: query i may attend key j
    source: Tensor  # [B, T] flat index (packed row × L + position) whose hidden state predicts token t of row b
    computed_positions: int  # R × L, for the record


def share_prompts(input_ids: Tensor, response_index: Tensor, response_mask: Tensor, completion_ids: Tensor,
                  pad_token_id: int = 0) -> SharedPromptRows:
    """Pack right-padded ``prompt + completion`` rows (:class:`polyrl.algos.logprobs.PackedBatch`
    layout) into one row per distinct prompt."""
    batch, width = response_index.shape
    prompt_lengths = (response_index[:, 0] + 1).tolist()  # token 0 is predicted by the prompt's last position
    completion_lengths = response_mask.sum(dim=1).tolist()
    ids = input_ids.tolist()
    groups: dict[tuple[int, ...], list[int]] = {}
    for row in range(batch):
        groups.setdefault(tuple(ids[row][: prompt_lengths[row]]), []).append(row)
    packed_lengths = [len(prompt) + sum(completion_lengths[row] for row in rows) for prompt, rows in groups.items()]
    length = max(packed_lengths)
    packed = torch.full((len(groups), length), pad_token_id, dtype=input_ids.dtype)
    positions = torch.zeros((len(groups), length), dtype=torch.long)
    segment = torch.full((len(groups), length), -1, dtype=torch.long)  # 0: prompt, k: k-th completion, -1: padding
    source = torch.zeros((batch, width), dtype=torch.long)
    for index, (prompt, rows) in enumerate(groups.items()):
        n_prompt = len(prompt)
        packed[index, :n_prompt] = torch.as_tensor(prompt, dtype=input_ids.dtype)
        positions[index, :n_prompt] = torch.arange(n_prompt)
        segment[index, :n_prompt] = 0
        start = n_prompt
        for k, row in enumerate(rows, start=1):
            n = completion_lengths[row]
            packed[index, start : start + n] = completion_ids[row, :n]
            positions[index, start : start + n] = torch.arange(n_prompt, n_prompt + n)
            segment[index, start : start + n] = k
            # Token 0 is predicted by the prompt's last position, token t > 0 by the completion's
            # token t - 1; masked slots point at the prompt's last position (a value never used).
            where = torch.full((width,), n_prompt - 1, dtype=torch.long)
            if n > 1:
                where[1:n] = torch.arange(start, start + n - 1)
            source[row] = index * length + where
            start += n
    query, key = segment[:, :, None], segment[:, None, :]
    causal = torch.ones((length, length), dtype=torch.bool).tril()
    allowed = causal & (query >= 0) & (key >= 0) & ((key == 0) | (key == query))
    # A padding position attends to itself only, so that no softmax row is empty (NaN).
    allowed |= torch.eye(length, dtype=torch.bool) & (query < 0)
    return SharedPromptRows(packed, positions, allowed, source, computed_positions=len(groups) * length)


def shared_prompt_hidden(decoder: torch.nn.Module, batch, *, pad_token_id: int = 0) -> Tensor:
    """Final hidden states ``[B, T, H]`` at the positions that predict each completion token,
    computed with one forward per distinct prompt (``batch``: a text-only ``PackedBatch``)."""
    rows = share_prompts(batch.input_ids, batch.response_index, batch.response_mask, batch.completion_ids, pad_token_id)
    device = batch.input_ids.device
    allowed = rows.allowed.to(device)
    if getattr(getattr(decoder, "config", None), "_attn_implementation", None) == "eager":
        # The eager attention adds the mask to its scores: 0 where allowed, the dtype's minimum elsewhere.
        dtype = next(decoder.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    else:
        mask = allowed  # sdpa takes a boolean mask (True: attend) whatever the autocast dtype
    hidden = decoder(input_ids=rows.input_ids.to(device), position_ids=rows.position_ids.to(device),
                     attention_mask=mask[:, None], use_cache=False).last_hidden_state
    flat = hidden.reshape(-1, hidden.shape[-1])
    return flat[rows.source.to(device).reshape(-1)].reshape(*rows.source.shape, hidden.shape[-1])


def prompt_group_ids(input_ids: Tensor, response_index: Tensor) -> Tensor:
    """``[B]`` ids, equal for rows whose prompt token ids are equal (first-appearance order)."""
    prompt_lengths = (response_index[:, 0] + 1).tolist()
    seen: dict[tuple[int, ...], int] = {}
    ids = input_ids.tolist()
    return torch.as_tensor([seen.setdefault(tuple(row[:n]), len(seen)) for row, n in zip(ids, prompt_lengths)], dtype=torch.long)


def prompt_grouped_micro_batches(rows: Tensor, group_ids: Tensor, size: int) -> list[Tensor]:
    """``rows`` in micro-batches of ``size`` with the rows of one prompt next to each other, so
    that a micro-batch holds whole groups where ``size`` allows (a stable sort by group)."""
    order = torch.argsort(group_ids[rows], stable=True)
    return list(torch.split(rows[order], size))


def sharing_refusal(model: torch.nn.Module, *, takes_images: bool) -> str | None:
    """Why ``train.share_prompts`` cannot apply to ``model``, or None when it can."""
    if takes_images:
        return "text policies only; this policy is an image-text model"
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or head is None or decoder is model:
        return f"{type(model).__name__} has no separate decoder and output head"
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attention not in ("sdpa", "eager"):
        return f"needs attention that takes a 4-D mask (sdpa or eager); this policy uses {attention!r}"
    return None
