"""The learner's batch: completions packed into right-padded tensors, one row per completion.

Its own module because every forward path (the plain one, the packed rows, the shared prompts)
and the set-up probes that check those paths build on it, while depending on none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import torch
from torch import Tensor

from polyrl.core.types import Completion


@dataclass
class PackedBatch:
    """One row per completion. ``B`` rows, ``S`` = longest prompt+completion, ``T`` = longest completion."""

    input_ids: Tensor  # [B, S] prompt + completion, right-padded with the pad id
    attention_mask: Tensor  # [B, S] 1 on real tokens
    response_mask: Tensor  # [B, T] 1 on completion tokens
    response_index: Tensor  # [B, T] position in input_ids whose next-token logits predict completion token t
    completion_ids: Tensor  # [B, T] completion tokens, padded with the pad id
    # Sampler log-probs of the completion tokens (0 where masked): the behaviour policy's
    # log-probs for truncated importance sampling and the sampler/learner gap.
    sampling_logprobs: Tensor | None = None  # [B, T] float32
    # Per row: the processor's image tensors of its prompt, None for a text-only row (a list,
    # not a tensor: models lay image tensors out differently; collated in the forward).
    image_inputs: list[dict[str, Tensor] | None] | None = None
    # Ids banned in sampling, masked to -inf before the learner's softmax (shared by all rows).
    banned_token_ids: Tensor | None = None  # [K] long

    def to(self, device: torch.device | str) -> "PackedBatch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return PackedBatch(**{k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in moved.items()})

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, rows: Tensor | Sequence[int] | slice) -> "PackedBatch":
        """A sub-batch (micro-batch) of rows; padding columns are kept as they are."""
        if not isinstance(rows, slice):
            rows = torch.as_tensor(rows, dtype=torch.long)
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or f.name == "banned_token_ids":
                picked[f.name] = value
            elif f.name == "image_inputs":
                order = range(len(value))[rows] if isinstance(rows, slice) else rows.tolist()
                picked[f.name] = [value[i] for i in order]
            else:
                picked[f.name] = value[rows]
        return PackedBatch(**picked)


def pack_completions(completions: list[Completion], *, pad_token_id: int) -> PackedBatch:
    """Pack completions into right-padded learner tensors (see :class:`PackedBatch`).

    A completion with no tokens gets an all-zero response mask row. Rows whose
    ``sampling_logprobs`` length differs from ``completion_ids`` raise, because the
    sampler/learner comparison would silently misalign.
    """
    if not completions:
        raise ValueError("pack_completions needs at least one completion")
    batch_size = len(completions)
    seq_len = max(len(c.prompt_ids) + len(c.completion_ids) for c in completions)
    resp_len = max(1, max(len(c.completion_ids) for c in completions))

    input_ids = torch.full((batch_size, seq_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch_size, seq_len), dtype=torch.long)
    response_mask = torch.zeros((batch_size, resp_len), dtype=torch.long)
    response_index = torch.zeros((batch_size, resp_len), dtype=torch.long)
    completion_ids = torch.full((batch_size, resp_len), pad_token_id, dtype=torch.long)
    sampling_logprobs = torch.zeros((batch_size, resp_len), dtype=torch.float32)

    for row, c in enumerate(completions):
        n_prompt, n_resp = len(c.prompt_ids), len(c.completion_ids)
        if n_prompt == 0:
            raise ValueError(f"completion {row} has an empty prompt: the first token has nothing to be predicted from")
        if c.sampling_logprobs and len(c.sampling_logprobs) != n_resp:
            raise ValueError(f"completion {row}: {len(c.sampling_logprobs)} sampling log-probs for {n_resp} completion tokens")
        input_ids[row, :n_prompt] = torch.as_tensor(c.prompt_ids, dtype=torch.long)
        if n_resp:
            input_ids[row, n_prompt : n_prompt + n_resp] = torch.as_tensor(c.completion_ids, dtype=torch.long)
            completion_ids[row, :n_resp] = torch.as_tensor(c.completion_ids, dtype=torch.long)
            # An episode's observation tokens (Completion.completion_mask 0) are inputs, not actions:
            # off the response mask, hence out of every loss, normaliser and metric built on it.
            response_mask[row, :n_resp] = torch.as_tensor(c.completion_mask, dtype=torch.long) if c.completion_mask else 1
            response_index[row, :n_resp] = torch.arange(n_prompt - 1, n_prompt - 1 + n_resp)
            if c.sampling_logprobs:
                sampling_logprobs[row, :n_resp] = torch.as_tensor(c.sampling_logprobs, dtype=torch.float32)
        attention_mask[row, : n_prompt + n_resp] = 1
    # Masked response slots point at the row's last prompt position: a valid index whose
    # value is ignored.
    last_prompt = torch.as_tensor([len(c.prompt_ids) - 1 for c in completions], dtype=torch.long)
    response_index = torch.where(response_mask.bool(), response_index, last_prompt[:, None])
    banned = {tuple(c.banned_token_ids) for c in completions}
    if len(banned) > 1:
        raise ValueError("completions of one batch were sampled with different banned token ids (different engines?)")
    banned_ids = next(iter(banned))
    return PackedBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        response_index=response_index,
        completion_ids=completion_ids,
        sampling_logprobs=sampling_logprobs,
        image_inputs=[c.image_inputs for c in completions] if any(c.image_inputs for c in completions) else None,
        banned_token_ids=torch.as_tensor(banned_ids, dtype=torch.long) if banned_ids else None,
    )
