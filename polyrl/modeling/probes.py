"""Probes: does a shortcut the learner takes through a model give the model's own answer?

The learner takes three shortcuts through a causal LM, each resting on a property of the
architecture that a list of names cannot vouch for:

* decoder → head (:mod:`polyrl.modeling.logprobs`): the final hidden states are gathered at the
  scored positions and only those go through the output head. Right unless the model changes
  its logits after the head (Falcon-H1's ``lm_head_multiplier``, Gemma 2's final soft-cap,
  Cohere's ``logit_scale``, Granite's ``logits_scaling`` …).
* rows end to end (``train.padding_free``, :mod:`polyrl.modeling.packing`): right only if no
  layer carries information from one row to the next outside attention. A state-space or
  convolution mixer (Falcon-H1's Mamba beside attention, LFM2's short convolutions, Jamba's Mamba
  layers) runs along the whole packed sequence, so row 0's state flows into row 1.
* a prompt's completions in one row (``train.share_prompts``, :mod:`polyrl.modeling.shared_prompts`):
  right only if a 4-D attention mask is the only thing that keeps completions apart, for the same reason.

So each is checked on the model itself, once, on a few tokens: the shortcut against the model's
own forward (``model(ids).logits``, each row alone), and for the packed forms also a leak check
(a row's log-probs must not move when the other row changes). A shortcut is used only where
they agree: to :data:`TOLERANCE` where the same numbers are expected (decoder → head, the leak
check), and where sums run in another order (packed against alone) as closely as the padded
batch agrees with the rows alone, within a factor of 10 (:func:`_rows_probe`). A leak or a
dropped multiplier is orders of magnitude larger; an exception in the shortcut counts as
disagreement.
The probes run on the model as the learner holds it (its weights' dtype, LoRA, gradient
checkpointing), under ``no_grad``, autocast off and in eval mode (no dropout), on token ids from a
fixed generator: the same model always gets the same verdict. Each verdict is kept per model
object, so a probe runs once however often its answer is asked for.
"""

from __future__ import annotations

import re
import weakref
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import Tensor

from polyrl.core.types import Completion
from polyrl.modeling.batches import PackedBatch, pack_completions

__all__ = [
    "TOLERANCE",
    "decoder_and_head_refusal",
    "packing_refusal",
    "probe_rows",
    "sharing_probe_refusal",
    "shortcut_refusal",
]

# Largest |Δ log-prob| (nats, over the whole vocabulary at every probed position) accepted as
# float rounding when the weights are fp32 or fp64. Weights in 16-bit floats round much more
# coarsely; polyrl's learner keeps fp32 master weights, so that case only arises for a caller's
# own model, where a leak smaller than HALF_TOLERANCE would go unseen.
TOLERANCE = 1e-5
HALF_TOLERANCE = 5e-2
# Probe token ids are drawn from the first ids of the vocabulary: ordinary tokens in byte-level
# BPEs, far from the image and control tokens that multimodal models keep at the top.
_ID_RANGE = 200
_SEED = 20260101
# The largest logit of the shortcut probe (see _shortcut_probe): well past the soft-caps in use (30).
_PROBE_LOGIT = 100.0

_VERDICTS: "weakref.WeakKeyDictionary[torch.nn.Module, dict[str, str | None]]" = weakref.WeakKeyDictionary()


def decoder_and_head_refusal(model: torch.nn.Module) -> str | None:
    """Why ``model`` has no separate decoder and output head (prompt sharing, packed rows and the
    decoder → head shortcut all gather hidden states between the two), or None when it has."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or head is None or decoder is model:
        return f"{type(model).__name__} has no separate decoder and output head"
    return None


def tolerance(model: torch.nn.Module) -> float:
    dtype = next(model.parameters()).dtype
    return TOLERANCE if dtype in (torch.float32, torch.float64) else HALF_TOLERANCE


def _named_token_ids(config: object) -> set[int]:
    """The ids a config names (``image_token_id``, ``pad_token_id`` …, its text config's too): a
    multimodal forward expects its image features at an image token, so probes avoid them all."""
    named: set[int] = set()
    for part in (config, getattr(config, "text_config", None)):
        for key, value in (vars(part) if part is not None and hasattr(part, "__dict__") else {}).items():
            if key.endswith(("token_id", "token_index", "token_ids")):
                values = value if isinstance(value, (list, tuple)) else [value]
                named.update(v for v in values if isinstance(v, int))
    return named


def probe_rows(model: torch.nn.Module, lengths: list[int], *, seed: int = _SEED) -> list[list[int]]:
    """Rows of token ids of the given lengths, the same for every call (a fixed generator)."""
    config = getattr(model, "config", None)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    vocab = int(getattr(embeddings, "num_embeddings", None) or getattr(config, "vocab_size", None) or 2)
    allowed = [i for i in range(min(vocab, _ID_RANGE)) if i not in _named_token_ids(config)] or list(range(min(vocab, _ID_RANGE)))
    generator = torch.Generator().manual_seed(seed)
    return [[allowed[i] for i in torch.randint(0, len(allowed), (n,), generator=generator).tolist()] for n in lengths]


@contextmanager
def _probing(model: torch.nn.Module) -> Iterator[None]:
    """No gradients, no autocast, no dropout; the model's training flag and attention
    implementation as they were afterwards (a packed probe switches the attention)."""
    config = getattr(model, "config", None)
    attention = getattr(config, "_attn_implementation", None)
    training = model.training
    device_type = next(model.parameters()).device.type
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device_type, enabled=False):
            yield
    finally:
        model.train(training)
        if config is not None and getattr(config, "_attn_implementation", None) != attention:
            config._attn_implementation = attention


def _cached(model: torch.nn.Module, name: str, probe: Callable[[], str | None]) -> str | None:
    verdicts = _VERDICTS.setdefault(model, {})
    if name not in verdicts:
        verdicts[name] = probe()
    return verdicts[name]


def _log_softmax(logits: Tensor) -> Tensor:
    """In float32 or wider, as the learner scores (:func:`polyrl.modeling.logprobs.token_logprobs`)."""
    return torch.log_softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)


def _own_logprobs(model: torch.nn.Module, ids: list[int]) -> Tensor:
    """``log_softmax(model(ids).logits)`` of one row alone: ``[len(ids), V]``."""
    device = next(model.parameters()).device
    return _log_softmax(model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0])


def _head_logprobs(model: torch.nn.Module, hidden: Tensor) -> Tensor:
    return _log_softmax(model.get_output_embeddings()(hidden))


def _gap(a: Tensor, b: Tensor) -> float:
    """Largest |a - b|; equal entries (the same -inf of a masked logit too) count 0, NaN counts inf."""
    if a.shape != b.shape:
        return float("inf")
    a, b = a.double(), b.double()
    diff = torch.where(a == b, torch.zeros_like(a), (a - b).abs())
    return float(torch.nan_to_num(diff, nan=float("inf")).max()) if diff.numel() else 0.0


def _failed(what: str, error: Exception) -> str:
    message = str(error).splitlines()[0] if str(error) else ""
    # polyrl's own refusals (e.g. the per-row attention count) name the setting and the way out;
    # here they are a reason inside another message, which says both itself.
    message = re.sub(r"^train\.\w+: ", "", message).removesuffix("; set it to false")
    return f"{what} raised {type(error).__name__}{': ' + message[:200] if message else ''}"


def shortcut_refusal(model: torch.nn.Module) -> str | None:
    """Why the decoder → head shortcut does not give ``model``'s own log-probs, or None when it
    does (checked once per model: :func:`_shortcut_probe`)."""
    if (refusal := decoder_and_head_refusal(model)) is not None:
        return refusal
    return _cached(model, "shortcut", lambda: _shortcut_probe(model))


def _shortcut_probe(model: torch.nn.Module) -> str | None:
    """One row of 8 tokens: ``log_softmax(model(ids).logits)`` against the output head applied to
    the decoder's final hidden states, at every position.

    A random model's logits are small, where a soft-cap (``c·tanh(x/c)``) is nearly the identity;
    so during the probe the head's output is scaled (a forward hook, which both paths go through)
    until its largest logit is :data:`_PROBE_LOGIT`. A scaling after the head then shows as whole
    nats, and a model without one gives the same numbers both ways (the same operations)."""
    (ids,) = probe_rows(model, [8])
    name = type(model).__name__
    head = model.get_output_embeddings()
    device = next(model.parameters()).device
    with _probing(model):
        try:
            hidden = model.get_decoder()(input_ids=torch.tensor([ids], device=device), use_cache=False).last_hidden_state[0]
            shortcut = _head_logprobs(model, hidden)
            plain = _gap(_own_logprobs(model, ids), shortcut)  # as the model stands: what the report says
            scale = _PROBE_LOGIT / max(float(model.get_output_embeddings()(hidden).abs().max()), 1e-6)
            handle = head.register_forward_hook(lambda _module, _args, out: out * scale if isinstance(out, Tensor) else out)
            try:
                magnified = _gap(_own_logprobs(model, ids), _head_logprobs(model, hidden))
            finally:
                handle.remove()
        except Exception as error:  # noqa: BLE001 - any failure of the shortcut is a verdict against it
            return _failed(f"{name}: decoder then output head", error)
    limit = tolerance(model)
    if max(plain, magnified) > limit:
        return (
            f"{name}'s own forward changes the logits after its output head (e.g. a logit multiplier, scale or "
            f"soft-cap): decoder then head differs from model(ids).logits by {plain:.3g} nats on the probe's tokens "
            f"({magnified:.3g} with its logits magnified; tolerance {limit:g})"
        )
    return None


Rows = list[tuple[list[int], list[int]]]  # (prompt ids, completion ids) per row


def _probe_batch(rows: Rows) -> PackedBatch:
    completions = [
        Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[], finish_reason="length") for p, c in rows
    ]
    return pack_completions(completions, pad_token_id=0)


def _completion_logprobs(model: torch.nn.Module, rows: Rows, forward: Callable[[object], Tensor] | None) -> list[Tensor]:
    """Each row's log-probs ``[T_row, V]`` at its completion's positions: through ``forward``
    (a packed forward's hidden states ``[B, T, H]``, then the head), or with ``None`` the padded
    batch's own forward (``model(ids, attention_mask).logits``, the learner's plain path)."""
    batch = _probe_batch(rows).to(next(model.parameters()).device)
    if forward is None:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        index = batch.response_index[..., None].expand(-1, -1, logits.shape[-1])
        states = _log_softmax(torch.gather(logits, 1, index))
    else:
        states = _head_logprobs(model, forward(batch))
    return [states[row, : len(completion)] for row, (_, completion) in enumerate(rows)]


def _alone(model: torch.nn.Module, rows: Rows) -> list[Tensor]:
    return [_own_logprobs(model, p + c)[len(p) - 1 : len(p) - 1 + len(c)] for p, c in rows]


def _rows_probe(
    model: torch.nn.Module, rows: Rows, row_0_changed: Rows, row_1_changed: Rows, forward: Callable[[object], Tensor], what: str
) -> str | None:
    """The verdict on a way of running rows together (``forward``), from two checks:

    * no leak: row 1's log-probs are the same whatever row 0 holds (``row_0_changed``: other
      ids, same lengths), and row 0's whatever row 1 holds. The shapes are the same, so a model
      whose rows only meet in the per-row attention gives the same numbers (measured: exactly,
      at SmolLM2-135M in fp32); tolerance :func:`tolerance`.
    * agreement: each row's log-probs are those of the row alone (``model(ids).logits``), as
      closely as the padded batch's are (the same sums in another order round differently: in
      SmolLM2-135M at fp32 a few 1e-5 nats over the whole vocabulary), within a factor of 10.
      This catches what a leak check cannot, e.g. positions that do not restart with each row.
    """
    name = type(model).__name__
    with _probing(model):
        try:
            together = _completion_logprobs(model, rows, forward)
            leak = max(
                _gap(together[1], _completion_logprobs(model, row_0_changed, forward)[1]),
                _gap(together[0], _completion_logprobs(model, row_1_changed, forward)[0]),
            )
            alone = _alone(model, rows)
            padded = _completion_logprobs(model, rows, None)
        except Exception as error:  # noqa: BLE001 - any failure of the packed forward is a verdict against it
            return _failed(f"{name}: {what}", error)
    limit = tolerance(model)
    if leak > limit:
        return (
            f"{name}: in {what}, changing one row moves the other's log-probs by {leak:.3g} nats (> {limit:g}), so "
            "something other than attention carries one row into the next (e.g. a state-space or convolution mixer)"
        )
    gap = max(_gap(a, b) for a, b in zip(together, alone))
    floor = max(limit, 10 * max(_gap(a, b) for a, b in zip(padded, alone)))
    if gap > floor:
        return f"{name}: {what} gives other log-probs than each row alone ({gap:.3g} nats > {floor:.3g})"
    return None


# The packed forwards under test come in as arguments (``packed_forward(model, batch)``,
# ``shared_forward(decoder, batch)``): their modules call these probes, so importing them here
# would make a loop.
def packing_refusal(model: torch.nn.Module, packed_forward: Callable[[torch.nn.Module, PackedBatch], Tensor]) -> str | None:
    """Why rows laid end to end (``train.padding_free``) do not give each row's own log-probs,
    or None when they do (checked once per model: two rows of 6 + 4 and 3 + 5 tokens)."""
    if (refusal := shortcut_refusal(model)) is not None:
        return f"the decoder → head shortcut it runs on does not apply: {refusal}"
    return _cached(model, "packing", lambda: _packing_probe(model, packed_forward))


def _packing_probe(model: torch.nn.Module, packed_forward: Callable[[torch.nn.Module, PackedBatch], Tensor]) -> str | None:
    p0, c0, p1, c1, q0, d0, q1, d1 = probe_rows(model, [6, 4, 3, 5, 6, 4, 3, 5])
    return _rows_probe(
        model,
        [(p0, c0), (p1, c1)],
        [(q0, d0), (p1, c1)],
        [(p0, c0), (q1, d1)],
        lambda batch: packed_forward(model, batch),
        "rows packed end to end",
    )


def sharing_probe_refusal(model: torch.nn.Module, shared_forward: Callable[[torch.nn.Module, PackedBatch], Tensor]) -> str | None:
    """Why a prompt's completions packed into one row (``train.share_prompts``) do not give each
    row's own log-probs, or None when they do (checked once per model: one prompt of 4 tokens,
    completions of 3 and 5)."""
    if (refusal := shortcut_refusal(model)) is not None:
        return f"the decoder → head shortcut it runs on does not apply: {refusal}"
    return _cached(model, "sharing", lambda: _sharing_probe(model, shared_forward))


def _sharing_probe(model: torch.nn.Module, shared_forward: Callable[[torch.nn.Module, PackedBatch], Tensor]) -> str | None:
    prompt, c0, c1, d0, d1 = probe_rows(model, [4, 3, 5, 3, 5])
    return _rows_probe(
        model,
        [(prompt, c0), (prompt, c1)],
        [(prompt, d0), (prompt, c1)],
        [(prompt, c0), (prompt, d1)],
        lambda batch: shared_forward(model.get_decoder(), batch),
        "a prompt's completions in one row",
    )
