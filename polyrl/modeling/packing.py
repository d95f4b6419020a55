"""Padding-free learner forwards (``train.padding_free``): a micro-batch's rows end to end.

A micro-batch of ``prompt + completion`` rows is right-padded to its longest row, and every
padding position runs through every decoder layer (its matmuls, norms and MLP) for nothing.
Here the rows are laid end to end as one sequence of ``N = Σ lengths`` tokens, each row with its
own position ids restarting at 0, as verl's remove-padding (``use_remove_padding``) and
OpenRLHF's packed samples (``packing_samples``) do. The matmuls then run over the real tokens only.

Attention must not cross rows. transformers offers two ways for packed sequences: flash-attention
kwargs (``cu_seq_lens_q`` …, what ``DataCollatorWithFlattening`` emits; flash kernels only, none
on CPU), and, for ``sdpa``/``eager``, detecting restarting ``position_ids`` when no attention mask
is given and building a dense block-diagonal ``[N, N]`` mask (``masking_utils.
find_packed_sequence_indices``). The dense mask is exact but makes attention quadratic in the
whole micro-batch (64 rows of 80 tokens: 26M query/key pairs per head and layer instead of 0.4M),
and the detection is silently skipped whenever a 2-D mask is passed along: rows then see each
other. So this module does neither. It registers an attention function that takes the packed
``q``, ``k``, ``v`` (``[1, heads, N, dim]``), lays them out again as padded rows
``[rows, heads, longest, dim]`` (a gather), runs the policy's own attention function (``sdpa``
or polyrl's fp32 ``sdpa`` on CPU) causally per row, and gathers the real positions back. A real
query never sees a padding key (padding follows it, causal), so every row attends exactly to its
own tokens; only attention, a small part of the work at these lengths, still computes the
padding slots, which is what the padded path does too.

How the row layout reaches the attention: as a keyword argument of the decoder's forward
(``polyrl_rows``), which transformers passes down to each layer's attention function; under
gradient checkpointing the layers' keyword arguments are kept for the recomputation, so the
backward's recomputed attention stays per row too. The policy's attention implementation is
switched once, to a wrapper that runs the per-row path when it gets a layout and the original
function (and its mask) otherwise, so padded forwards are unchanged. After each packed forward
the number of attention calls that took the layout is checked against the number of decoder
layers: a model whose layers do not pass it down is refused instead of attending across rows.

Attention is not the only way tokens meet. A state-space or convolution mixer (Falcon-H1's Mamba
beside attention in every layer, LFM2's short convolutions, Jamba's Mamba layers) runs along the
whole packed sequence and carries one row's state into the next. No list of such architectures
is kept: :func:`padding_free_refusal` runs the packed forward on two short rows at set-up and
uses it only where each row's log-probs are the same as alone and do not move when the other
row changes (:mod:`polyrl.modeling.probes`); :func:`resolve_padding_free` turns that verdict
into the setting (``auto`` falls back and says why, ``true`` is refused with the reason).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch import Tensor

from polyrl.core.errors import PolyrlError
from polyrl.modeling.probes import decoder_and_head_refusal, packing_refusal, shortcut_refusal
from polyrl.modeling.token_mixers import attention_free_refusal

__all__ = [
    "PaddingFree",
    "PaddingFreeError",
    "RowLayout",
    "base_attention",
    "padding_free_refusal",
    "packed_response_hidden",
    "resolve_padding_free",
    "row_layout",
    "use_packed_rows_attention",
]

ROWS_KWARG = "polyrl_rows"
SUFFIX = "+packed_rows"
# Attention functions the per-row path can delegate to: they take a None mask as "causal".
SUPPORTED_BASES = ("sdpa", "sdpa_fp32_on_cpu")
# Keyword arguments of an attention call that the per-row path cannot honour when set.
_UNSUPPORTED_KWARGS = ("softcap", "s_aux", "position_bias")


class PaddingFreeError(PolyrlError):
    """``train.padding_free`` cannot apply to this policy or batch."""


@dataclass
class RowLayout:
    """Where the rows of a micro-batch lie in their packed sequence of ``N`` tokens."""

    input_ids: Tensor  # [1, N] the rows' real tokens, end to end
    position_ids: Tensor  # [1, N] restarting at 0 on each row
    row_slots: Tensor  # [R, L] packed index of row r's position p (row r's first token on padding slots)
    token_slots: Tensor  # [N] index into the flattened [R × L] padded layout of each packed token
    longest: int  # L
    attention_calls: list[int] = field(default_factory=lambda: [0])  # per-row attention calls (checked after a forward)

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])


def row_layout(input_ids: Tensor, attention_mask: Tensor) -> RowLayout:
    """The packed layout of right-padded rows (``attention_mask`` 1 on each row's real prefix)."""
    lengths = attention_mask.sum(dim=1).to(torch.long)
    if bool((lengths == 0).any()):
        raise ValueError("padding-free packing: a row has no tokens")
    device = input_ids.device
    rows, longest = int(lengths.shape[0]), int(lengths.max())
    offsets = torch.cumsum(lengths, 0) - lengths  # [R] where each row starts in the packed sequence
    positions = torch.arange(longest, device=device)[None, :]  # [1, L]
    real = positions < lengths[:, None]  # [R, L]
    row_slots = torch.where(real, offsets[:, None] + positions, offsets[:, None])
    token_slots = (torch.arange(rows, device=device)[:, None] * longest + positions).expand(rows, longest)[real]
    packed_ids = input_ids[:, :longest][real][None, :]
    packed_positions = positions.expand(rows, longest)[real][None, :]
    return RowLayout(packed_ids, packed_positions, row_slots, token_slots, longest)


def _per_row_attention(base: Callable, module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                       layout: RowLayout, kwargs: dict[str, Any]) -> tuple[Tensor, None]:  # fmt: skip
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise PaddingFreeError(
                f"train.padding_free: this model's attention uses {name!r}, which per-row attention does not apply; set it to false"
            )
    rows, longest = layout.row_slots.shape

    def as_rows(x: Tensor) -> Tensor:  # [1, heads, N, dim] -> [R, heads, L, dim]
        return x[0].transpose(0, 1)[layout.row_slots].transpose(1, 2)

    mask = None  # the base attention runs causally (sdpa's is_causal) over each padded row
    window = kwargs.pop("sliding_window", None)
    if window is not None and longest > window:
        # transformers' sliding window: key j is visible from query i when i - window < j <= i.
        i = torch.arange(longest, device=query.device)
        mask = ((i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window))[None, None]
    out, _ = base(module, as_rows(query), as_rows(key), as_rows(value), mask, **kwargs)  # [R, L, heads, dim]
    layout.attention_calls[0] += 1
    return out.reshape(rows * longest, *out.shape[2:])[layout.token_slots][None], None


def _register(base_name: str) -> str:
    """Register ``base_name + SUFFIX`` with transformers' attention and mask interfaces."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = base_name + SUFFIX
    if name in ALL_ATTENTION_FUNCTIONS:
        return name
    base = ALL_ATTENTION_FUNCTIONS[base_name]
    base_mask = ALL_MASK_ATTENTION_FUNCTIONS[base_name]

    def attention(module, query, key, value, attention_mask, **kwargs):
        layout = kwargs.pop(ROWS_KWARG, None)
        if layout is None:
            return base(module, query, key, value, attention_mask, **kwargs)
        return _per_row_attention(base, module, query, key, value, layout, kwargs)

    def mask(*args, **kwargs):
        # A packed forward needs no mask (the layout is the mask); transformers would otherwise
        # build a dense [N, N] block-diagonal one from the restarting positions.
        return None if _PACKED_FORWARD.get() else base_mask(*args, **kwargs)

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, mask)
    return name


_PACKED_FORWARD: ContextVar[bool] = ContextVar("polyrl_packed_forward", default=False)


def base_attention(model: torch.nn.Module) -> str | None:
    """``model``'s attention implementation, without the padding-free wrapper's suffix."""
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return attention.removesuffix(SUFFIX) if isinstance(attention, str) else attention


def padding_free_refusal(model: torch.nn.Module, *, takes_images: bool = False) -> str | None:
    """Why padding-free forwards cannot apply to ``model``, or None when they can: what its
    structure rules out, then the probe of two rows packed against each alone
    (:func:`polyrl.modeling.probes.packing_refusal`, run once per model)."""
    return _structural_refusal(model, takes_images=takes_images) or packing_refusal(model, packed_response_hidden)


class PaddingFree(NamedTuple):
    """``train.padding_free`` resolved for a policy: on or off, and why off (None when on or set false)."""

    enabled: bool
    reason: str | None = None


def resolve_padding_free(
    setting: bool | str, policy: torch.nn.Module, *, takes_images: bool, share_prompts: bool, compile: bool
) -> PaddingFree:
    """``train.padding_free`` for this policy: ``true`` is refused where it cannot apply (a
    :class:`PaddingFreeError` naming the reason), ``auto`` is on exactly where it can and
    otherwise off with the reason, for the run to say and record. The decoder → head probe runs
    here whatever the setting: every learner forward asks for its verdict, and here it runs
    before ``train.compile`` compiles the layers (a probe after would compile them once more)."""
    shortcut_refusal(policy)
    if setting is False:
        return PaddingFree(False)
    refusal = (
        "share_prompts packs the rows its own way"
        if share_prompts
        else "compiled decoder layers (train.compile) would recompile for every packed length"
        if compile
        else padding_free_refusal(policy, takes_images=takes_images)
    )
    if refusal is None:
        return PaddingFree(True)
    if setting is True:
        raise PaddingFreeError(f"train.padding_free: {refusal}; set it to false or auto")
    return PaddingFree(False, refusal)


def _structural_refusal(model: torch.nn.Module, *, takes_images: bool = False) -> str | None:
    """What in ``model``'s structure rules padding-free forwards out (no probe: cheap, and what
    the probe's own packed forward needs)."""
    if takes_images:
        return "text policies only; this policy is an image-text model (its image features are placed by padded rows)"
    if (refusal := decoder_and_head_refusal(model)) is not None:
        return refusal
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        return f"{type(decoder).__name__} has no `layers` list (the per-row attention is checked once per layer)"
    if (refusal := attention_free_refusal(model, what="rows packed end to end")) is not None:
        return refusal  # before the attention implementation: no implementation would make it apply
    if getattr(getattr(model, "config", None), "attn_logit_softcapping", None) is not None:
        return f"{type(model).__name__} soft-caps its attention scores (attn_logit_softcapping), which sdpa does not apply"
    attention = base_attention(model)
    if attention not in SUPPORTED_BASES:
        return f"needs sdpa attention (one of {', '.join(SUPPORTED_BASES)}); this policy uses {attention!r}"
    return None


def use_packed_rows_attention(model: torch.nn.Module) -> None:
    """Switch ``model`` to the per-row-capable wrapper of its attention (idempotent); padded
    forwards keep running the original function with its mask."""
    refusal = _structural_refusal(model)
    if refusal is not None:
        raise PaddingFreeError(f"train.padding_free: {refusal}; set it to false")
    current = model.config._attn_implementation
    if not current.endswith(SUFFIX):
        model.config._attn_implementation = _register(current)


@contextmanager
def _packed_forward() -> Iterator[None]:
    token = _PACKED_FORWARD.set(True)
    try:
        yield
    finally:
        _PACKED_FORWARD.reset(token)


def packed_response_hidden(model: torch.nn.Module, batch: Any) -> Tensor:
    """Final hidden states ``[B, T, H]`` at the positions that predict each completion token of
    ``batch`` (a text :class:`~polyrl.modeling.logprobs.PackedBatch`), from one forward of its rows
    packed end to end (see the module docstring)."""
    use_packed_rows_attention(model)
    decoder = model.get_decoder()
    layout = row_layout(batch.input_ids, batch.attention_mask)
    with _packed_forward():
        hidden = decoder(
            input_ids=layout.input_ids, position_ids=layout.position_ids, use_cache=False, **{ROWS_KWARG: layout}
        ).last_hidden_state[0]  # [N, H]
    expected = len(decoder.layers)
    if layout.attention_calls[0] != expected:
        raise PaddingFreeError(
            f"train.padding_free: {type(decoder).__name__} ran per-row attention in {layout.attention_calls[0]} of "
            f"{expected} layers, so its rows would see each other; set it to false"
        )
    # Completion token t of row b is predicted by row b's position response_index[b, t].
    return hidden[layout.row_slots.gather(1, batch.response_index)]
