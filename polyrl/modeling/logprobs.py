"""Packing completions into learner batches and computing per-token log-probs on the learner.

The learner scores the *same* token ids the rollout engine sampled. Each completion becomes
one row ``prompt_ids + completion_ids``, right-padded, so every row starts at position 0 and
the default positions (``0..S-1``) agree with the positions the sampler used; no position-id
bookkeeping is needed.

Completion token ``t`` of row ``b`` is predicted by the logits at position
``len(prompt_b) - 1 + t`` (``response_index``). :func:`token_logprobs` gathers the final
hidden states at those positions *before* the output head, so the ``[B, S, V]`` logits tensor
of the full sequence is never built: only ``[B, T, V]`` for the ``T`` response positions.

The sampler/learner parity contract: rollout engines report, for every sampled token, its
log-probability under ``log_softmax(logits / temperature)`` (see :mod:`polyrl.engines.base`), which is
exactly what :func:`token_logprobs` computes with the same ``temperature``.

Image batches: a row whose prompt had images carries the processor's image tensors
(``Completion.image_inputs``) and its *expanded* prompt ids (the image tokens in place). The
forward then goes through the multimodal base model with those tensors (the text decoder alone
takes no ``pixel_values``); the image tokens are prompt positions, so they are never scored and
never enter a loss. Token ids the sampler banned (``Completion.banned_token_ids``: the image and
special tokens of an image-text model) are set to ``-inf`` before the softmax, as the sampler did.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from polyrl.algos.losses import entropy_from_logits
from polyrl.core.types import Completion
from polyrl.modeling.batches import PackedBatch, pack_completions  # noqa: F401 - the learner's batch, importable from here too
from polyrl.modeling.packing import packed_response_hidden
from polyrl.modeling.probes import shortcut_refusal
from polyrl.modeling.shared_prompts import shared_prompt_hidden


def _response_states(
    model: torch.nn.Module, batch: PackedBatch, share_prompts: bool = False, padding_free: bool = False
) -> tuple[Tensor, torch.nn.Module | None]:
    """``(states [B, T, *], head)`` at the response positions only: the final hidden states and
    the output head that turns them into logits, or the logits themselves and ``None`` (models
    whose own forward does more after the head, e.g. a logit multiplier or soft-cap, found by
    :func:`polyrl.modeling.probes.shortcut_refusal`; or that have no separate head). With ``share_prompts``
    one forward per distinct prompt (:mod:`polyrl.modeling.shared_prompts`); with ``padding_free``
    one forward of the rows end to end (:mod:`polyrl.modeling.packing`)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    config = getattr(model, "config", None)
    index = batch.response_index
    if batch.image_inputs is not None and any(batch.image_inputs):
        if share_prompts or padding_free:
            raise ValueError("share_prompts and padding_free: text-only batches only (this batch has images)")
        return _image_response_states(model, batch, head)
    refusal = shortcut_refusal(model)  # None: a separate decoder and head, and nothing after the head
    if padding_free:
        if share_prompts:
            raise ValueError("padding_free and share_prompts pack rows differently; choose one")
        if refusal is not None:
            raise ValueError(f"padding_free: {refusal}")
        return packed_response_hidden(model, batch), head
    if share_prompts:
        if refusal is not None:
            raise ValueError(f"share_prompts: {refusal}")
        return shared_prompt_hidden(decoder, batch, pad_token_id=int(getattr(config, "pad_token_id", None) or 0)), head
    if refusal is None:
        hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).last_hidden_state
        return torch.gather(hidden, 1, index[..., None].expand(-1, -1, hidden.shape[-1])), head  # [B, T, H]
    # Generic path: the full forward, then slice (costs [B, S, V] memory).
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    return torch.gather(logits, 1, index[..., None].expand(-1, -1, logits.shape[-1])), None


def collate_image_inputs(rows: Sequence[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor]:
    """One forward's image inputs from each row's (``None``: a text-only row).

    Two layouts exist. Per-row tensors (Idefics3: ``pixel_values [1, N, C, H, W]``,
    ``pixel_attention_mask [1, N, H, W]``): padded to the most images with zeros — Idefics3
    drops all-zero images — and stacked, text-only rows all zeros. Flat tensors (Qwen2.5-VL:
    patches ``[P, D]`` and ``image_grid_thw [n, 3]``): concatenated over the rows that have
    images, in row order, which is the order of the image tokens in the batch.
    """
    present = [row for row in rows if row]
    if not present:
        return {}
    out: dict[str, torch.Tensor] = {}
    for key in present[0]:
        sample = present[0][key]
        if sample.dim() >= 4 and sample.shape[0] == 1:
            most = max(row[key].shape[1] for row in present)
            padded = []
            for row in rows:
                value = row.get(key) if row else None
                blank = torch.zeros((1, most, *sample.shape[2:]), dtype=sample.dtype)
                if value is not None:
                    blank[:, : value.shape[1]] = value
                padded.append(blank)
            out[key] = torch.cat(padded)
        else:
            out[key] = torch.cat([row[key] for row in present])
    return out


def image_forward_inputs(model: torch.nn.Module, batch: PackedBatch) -> dict[str, Tensor]:
    """The batch's collated image tensors on its device, pixel values in ``model``'s dtype: the
    keyword arguments a multimodal forward takes beside the ids (empty for a text-only batch)."""
    device = batch.input_ids.device
    images = {key: value.to(device) for key, value in collate_image_inputs(batch.image_inputs or []).items()}
    if "pixel_values" in images:
        images["pixel_values"] = images["pixel_values"].to(next(model.parameters()).dtype)
    return images


def _image_response_states(
    model: torch.nn.Module, batch: PackedBatch, head: torch.nn.Module | None
) -> tuple[Tensor, torch.nn.Module | None]:
    """Response states of a batch with images (see :func:`_response_states`): the multimodal
    base model's hidden states (vision tower, image features placed at the image tokens, text
    decoder) at the response positions, and the head. Models without a separate base model take
    the full forward, then slice the logits."""
    images = image_forward_inputs(model, batch)
    index = batch.response_index
    base = getattr(model, "base_model", None)
    if head is not None and base is not None and base is not model and shortcut_refusal(model) is None:
        hidden = base(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, **images).last_hidden_state
        return torch.gather(hidden, 1, index[..., None].expand(-1, -1, hidden.shape[-1])), head
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, **images).logits
    return torch.gather(logits, 1, index[..., None].expand(-1, -1, logits.shape[-1])), None


# One chunk's float32 logits take at most this many bytes (positions x vocabulary x 4): at a
# 49,152-token vocabulary 85 positions, at 150k 27, at a tiny model's every position at once.
# A chunk's softmax, log-softmax, entropy and their gradients hold several tensors of that size at
# a time (measured at 150k: ~10x in a backward with entropy). Below glibc's 32 MiB mmap threshold
# that polyrl sets for the learner (polyrl.runtime.host_memory), so chunks reuse freed heap memory.
LOGITS_CHUNK_BYTES = 16 * 2**20


def positions_per_chunk(vocab_size: int, budget_bytes: int = LOGITS_CHUNK_BYTES) -> int:
    """How many response positions' logits fit ``budget_bytes`` in float32 (at least one)."""
    return max(1, budget_bytes // (4 * max(1, vocab_size)))


def token_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    entropy_grad: bool = True,
    share_prompts: bool = False,
    padding_free: bool = False,
    chunk_positions: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Per-token ``log softmax(logits / temperature)[token]`` of the completion tokens.

    Returns ``(logprobs [B, T], entropy [B, T] or None)``, at least float32 (float64 for a
    float64 model) and 0 where ``response_mask`` is 0. Entropy is that of the same tempered
    distribution (:func:`polyrl.algos.losses.entropy_from_logits`, finite with ``-inf``
    logits). Gradients flow through the log-probs when the caller has grad enabled, and through
    the entropy only with ``entropy_grad`` (a loss with an entropy bonus); otherwise the entropy
    is a metric and is computed under ``no_grad``, which keeps its graph out of memory.
    ``temperature == 0`` (greedy sampling) is scored at temperature 1. ``share_prompts``: rows
    with the same prompt run as one packed row (:mod:`polyrl.modeling.shared_prompts`; the same
    values up to float rounding). ``padding_free``: the rows run end to end with no padding
    columns (:mod:`polyrl.modeling.packing`; the same values up to float rounding).

    Only the response tokens' positions are scored, ``chunk_positions`` of them at a time
    (default: :func:`positions_per_chunk` of the vocabulary), so the logits never exist for the
    whole batch at once: peak memory grows with the chunk, not with batch x length x
    vocabulary. With gradients, each chunk's head and softmax are recomputed in the backward
    (activation checkpointing of the output head), so the backward too holds one chunk's logits
    at a time; a batch that fits one chunk is computed directly, with no recomputation.
    """
    device = next(model.parameters()).device
    batch = batch.to(device)
    states, head = _response_states(model, batch, share_prompts, padding_free)
    mask = batch.response_mask.bool()
    chunk = chunk_positions or positions_per_chunk(states.shape[-1] if head is None else _head_vocab(head, states))
    rows, targets = states[mask], batch.completion_ids[mask]  # [N, H or V], [N]: only the positions that are scored
    banned = None if batch.banned_token_ids is None else batch.banned_token_ids.to(device)

    scored_chunks: set[int] = set()  # a chunk scored again is the backward's recomputation

    def score(part: Tensor, part_targets: Tensor, chunk_index: int) -> tuple[Tensor, Tensor]:
        recomputing = chunk_index in scored_chunks
        scored_chunks.add(chunk_index)
        logits = head(part) if head is not None else part
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        if banned is not None:
            logits = logits.index_fill(-1, banned, float("-inf"))
        if temperature and temperature != 1.0:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, part_targets[:, None]).squeeze(-1)
        if not compute_entropy or (recomputing and not entropy_grad):
            # A metric-only entropy has no gradient: the recomputation leaves it out (it was ~half
            # of the chunked backward's extra time at a 49k vocabulary).
            return logp, logp.new_zeros(())
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
            return logp, entropy_from_logits(logits if entropy_grad else logits.detach())

    recompute = torch.is_grad_enabled() and rows.shape[0] > chunk
    parts = []
    for start in range(0, rows.shape[0], chunk) or [0]:  # one empty chunk when nothing is scored: the result keeps its graph
        args = (rows[start : start + chunk], targets[start : start + chunk], start)
        parts.append(checkpoint(score, *args, use_reentrant=False) if recompute else score(*args))
    out_dtype = torch.float64 if states.dtype == torch.float64 else torch.float32
    logp = _scatter_positions([p[0] for p in parts], mask, out_dtype)
    entropy = _scatter_positions([p[1] for p in parts], mask, out_dtype) if compute_entropy else None
    return logp, entropy


def _head_vocab(head: torch.nn.Module, states: Tensor) -> int:
    """The vocabulary size of an output head that is not a plain ``nn.Linear`` (e.g. routed
    through oneDNN): from its weight, else by running it on one position."""
    weight = getattr(head, "weight", None)
    if isinstance(weight, Tensor) and weight.dim() == 2:
        return int(weight.shape[0])
    with torch.no_grad():
        return int(head(states.reshape(-1, states.shape[-1])[:1]).shape[-1])


def _scatter_positions(parts: list[Tensor], mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``[B, T]`` with the scored positions' values in place (row-major order of ``mask``), 0 elsewhere."""
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    if parts:
        values = torch.cat(parts)
        out = out.masked_scatter(mask, values.to(dtype))
    return out


def logprob_gap(engine_completions: list[Completion] | Tensor, learner_logprobs: Tensor, mask: Tensor) -> float:
    """Mean ``|sampler - learner|`` log-prob over response tokens (the ``rollout/logprob_gap`` metric).

    ``engine_completions`` is either the completions in batch row order (their
    ``sampling_logprobs`` are packed like :func:`pack_completions` does) or an already packed
    ``[B, T]`` tensor of sampler log-probs. With fp32 on both sides and weights in sync this is
    ~1e-6; a stale weight sync shows up as a gap of nats.
    """
    if isinstance(engine_completions, Tensor):
        sampler = engine_completions.float()
    else:
        sampler = torch.zeros(learner_logprobs.shape, dtype=torch.float32)
        for row, c in enumerate(engine_completions):
            if c.sampling_logprobs:
                sampler[row, : len(c.sampling_logprobs)] = torch.as_tensor(c.sampling_logprobs, dtype=torch.float32)
    sampler = sampler.to(learner_logprobs.device)
    mask = mask.to(learner_logprobs.device).bool()
    diff = (sampler - learner_logprobs.detach().float()).abs()
    return float(torch.where(mask, diff, torch.zeros_like(diff)).sum() / mask.sum().clamp(min=1))
