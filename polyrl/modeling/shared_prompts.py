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
* rows are grouped by equal prompt token ids (no group ids needed);
* the attention of a packed row runs over all its ``P + ΣT`` positions (the masked pairs are
  computed and discarded) instead of G rows of ``P + T``. For long completions that costs more
  than the prompt saves, so a completion joins its prompt's packed row only while a FLOP cost
  model says it pays (:func:`share_prompts`), and the learner's micro-batches are whole packs,
  longest first, so packed rows of similar length share a micro-batch.

Measured on the 2-core Intel Xeon, 30m policy, Dr.GRPO batches of 8 prompts × 8 samples
(prompts of 12 tokens), micro-batches of 16 rows, the same batches in one process, interleaved:
the update ×1.28 with completions of ~21 tokens (4 rounds: 7.77 → 5.94 s for 3 updates) and
×1.12 with completions of ~100 tokens (2 rounds: 30.9 → 27.6 s). Before the cost model and the
pack-level micro-batches, the long-completion case was ×0.84 (padded packs of mixed lengths).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from polyrl.core.errors import PolyrlError
from polyrl.modeling.probes import decoder_and_head_refusal, sharing_probe_refusal
from polyrl.modeling.token_mixers import attention_free_refusal

__all__ = [
    "SharePromptsError",
    "SharedPromptRows",
    "attention_cost_ratio",
    "plan_packs",
    "row_prompts",
    "share_prompts",
    "shared_prompt_hidden",
    "shared_prompt_micro_batches",
    "sharing_refusal",
]


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


def plan_packs(
    prompts: list[tuple[int, ...]], completion_lengths: list[int], attention_cost_ratio: float = math.inf
) -> list[list[int]]:
    """Rows (indices into ``prompts``) grouped into packed rows, in order of first row: a row
    joins its prompt's latest pack while that is cheaper than a pack of its own (see
    :func:`share_prompts` for the cost model)."""
    packs: list[list[int]] = []
    open_pack: dict[tuple[int, ...], tuple[int, int]] = {}  # prompt -> (its pack still taking completions, that pack's length)
    for row, (prompt, n) in enumerate(zip(prompts, completion_lengths)):
        if prompt in open_pack:
            index, length = open_pack[prompt]
            append = n + (2 * length * n + n * n) / attention_cost_ratio
            alone = len(prompt) + n + (len(prompt) + n) ** 2 / attention_cost_ratio
            if append <= alone:
                packs[index].append(row)
                open_pack[prompt] = (index, length + n)
                continue
        open_pack[prompt] = (len(packs), len(prompt) + n)
        packs.append([row])
    return packs


def share_prompts(
    input_ids: Tensor,
    response_index: Tensor,
    response_mask: Tensor,
    completion_ids: Tensor,
    pad_token_id: int = 0,
    attention_cost_ratio: float = math.inf,
) -> SharedPromptRows:
    """Pack right-padded ``prompt + completion`` rows (:class:`polyrl.modeling.logprobs.PackedBatch`
    layout) into rows of one prompt each, followed by as many of its completions as pay.

    A completion joins its prompt's current packed row while that is cheaper than a row of its
    own, by a cost model of ``tokens + (query, key) pairs / attention_cost_ratio`` (the ratio of a
    token's matmul work to one attention pair's, :func:`attention_cost_ratio`): appending ``T``
    tokens to a row of ``L`` costs ``T + (2LT + T²)/r``, a new row ``P + T + (P + T)²/r``. Short
    completions then all share one row; long ones, whose packed row's attention would grow
    quadratically for a small saving on the prompt, keep rows of their own (``r = inf``: always share).
    """
    batch, width = response_index.shape
    prompts = row_prompts(input_ids, response_index)
    completion_lengths = completion_widths(response_mask)
    packs = [(prompts[rows[0]], rows) for rows in plan_packs(prompts, completion_lengths, attention_cost_ratio)]
    length = max(len(prompt) + sum(completion_lengths[row] for row in rows) for prompt, rows in packs)
    packed = torch.full((len(packs), length), pad_token_id, dtype=input_ids.dtype)
    positions = torch.zeros((len(packs), length), dtype=torch.long)
    segment = torch.full((len(packs), length), -1, dtype=torch.long)  # 0: prompt, k: k-th completion, -1: padding
    source = torch.zeros((batch, width), dtype=torch.long)
    for index, (prompt, rows) in enumerate(packs):
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
    return SharedPromptRows(packed, positions, allowed, source, computed_positions=len(packs) * length)


def attention_cost_ratio(decoder: torch.nn.Module) -> float:
    """A token's matmul FLOPs over one (query, key) pair's attention FLOPs, per layer:
    ``2 · parameters per layer`` against ``4 · hidden size`` (``QKᵀ`` and ``PV``)."""
    layers = getattr(decoder, "layers", None)
    hidden = getattr(getattr(decoder, "config", None), "hidden_size", None)
    if not layers or not hidden:
        return math.inf
    return sum(p.numel() for p in layers[0].parameters()) / (2 * hidden)


def shared_prompt_hidden(decoder: torch.nn.Module, batch, *, pad_token_id: int = 0) -> Tensor:
    """Final hidden states ``[B, T, H]`` at the positions that predict each completion token,
    computed with a prompt's rows packed where that pays (``batch``: a text-only ``PackedBatch``)."""
    rows = share_prompts(
        batch.input_ids,
        batch.response_index,
        batch.response_mask,
        batch.completion_ids,
        pad_token_id,
        attention_cost_ratio=attention_cost_ratio(decoder),
    )
    device = batch.input_ids.device
    allowed = rows.allowed.to(device)
    if getattr(getattr(decoder, "config", None), "_attn_implementation", None) == "eager":
        # The eager attention adds the mask to its scores: 0 where allowed, the dtype's minimum elsewhere.
        dtype = next(decoder.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    else:
        mask = allowed  # sdpa takes a boolean mask (True: attend) whatever the autocast dtype
    hidden = decoder(
        input_ids=rows.input_ids.to(device),
        position_ids=rows.position_ids.to(device),
        attention_mask=mask[:, None],
        use_cache=False,
    ).last_hidden_state
    flat = hidden.reshape(-1, hidden.shape[-1])
    return flat[rows.source.to(device).reshape(-1)].reshape(*rows.source.shape, hidden.shape[-1])


def completion_widths(response_mask: Tensor) -> list[int]:
    """Each row's completion length: one past its last response token (an episode's observation
    tokens inside the completion are off the mask but still occupy their positions)."""
    columns = torch.arange(1, response_mask.shape[1] + 1, device=response_mask.device)
    return torch.where(response_mask.bool(), columns, torch.zeros_like(columns)).max(dim=1).values.tolist()


def row_prompts(input_ids: Tensor, response_index: Tensor) -> list[tuple[int, ...]]:
    """Each row's prompt token ids (the packed batch's rows are ``prompt + completion``)."""
    prompt_lengths = (response_index[:, 0] + 1).tolist()  # token 0 is predicted by the prompt's last position
    return [tuple(row[:n]) for row, n in zip(input_ids.tolist(), prompt_lengths)]


def shared_prompt_micro_batches(
    rows: Tensor, prompts: list[tuple[int, ...]], completion_lengths: list[int], size: int, attention_cost_ratio: float = math.inf
) -> list[Tensor]:
    """``rows`` in micro-batches of at most ``size`` rows made of whole packs (:func:`plan_packs`),
    longest pack first, so that the packed rows of a micro-batch have similar lengths and little
    padding (as :func:`polyrl.modeling.microbatches.length_sorted_micro_batches` does for rows). A
    pack of more than ``size`` rows is cut. Planning the packs again on a micro-batch's rows in
    this order gives the same packs."""
    order = rows.tolist()
    planned = plan_packs([prompts[r] for r in order], [completion_lengths[r] for r in order], attention_cost_ratio)
    packs = [[order[i] for i in pack] for pack in planned]
    packs.sort(key=lambda pack: len(prompts[pack[0]]) + sum(completion_lengths[r] for r in pack), reverse=True)
    batches: list[list[int]] = []
    for pack in packs:
        for start in range(0, len(pack), size):
            piece = pack[start : start + size]
            if batches and len(batches[-1]) + len(piece) <= size:
                batches[-1] += piece
            else:
                batches.append(list(piece))
    return [torch.as_tensor(batch, dtype=rows.dtype) for batch in batches]


def _takes_sdpa_masks(attention: str | None) -> bool:
    """``sdpa``, or an attention registered with its mask (e.g. a bf16 learner's fp32 sdpa on CPU)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    return (
        attention is not None
        and attention in ALL_MASK_ATTENTION_FUNCTIONS
        and ALL_MASK_ATTENTION_FUNCTIONS[attention] is sdpa_mask
    )


def sharing_refusal(model: torch.nn.Module, *, takes_images: bool) -> str | None:
    """Why ``train.share_prompts`` cannot apply to ``model``, or None when it can: what its
    structure rules out, then the probe of a prompt's two completions in one row against each
    row alone (:func:`polyrl.modeling.probes.sharing_probe_refusal`, run once per model), which
    refuses models whose layers mix tokens outside attention (a state-space or convolution mixer
    would carry one completion into the next, whatever the mask says)."""
    if takes_images:
        return "text policies only; this policy is an image-text model"
    if (refusal := decoder_and_head_refusal(model)) is not None:
        return refusal
    if (refusal := attention_free_refusal(model, what="a prompt's completions in one row")) is not None:
        return refusal
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attention != "eager" and not _takes_sdpa_masks(attention):
        return f"needs attention that takes a 4-D mask (sdpa or eager); this policy uses {attention!r}"
    return sharing_probe_refusal(model, shared_prompt_hidden)
