"""Whether a model's layers mix tokens through attention at all.

A pure state-space model (Mamba, "Mamba: Linear-Time Sequence Modeling with Selective State
Spaces", Gu and Dao, arXiv 2312.00752, §3; Mamba-2, FalconMamba) has no attention layer: each
layer's mixer runs a selective scan along the sequence, carrying a state from every token to
the next. The learner's packed forms (``train.padding_free``, ``train.share_prompts``) rest on an
attention mask or a per-row attention keeping rows apart, so for such a model they would carry
one row's (or one completion's) state into the next; no attention implementation could change
that. Saying "needs sdpa attention" there would send a user after the wrong setting, so this is
checked before the attention implementation is.

Hybrids (Falcon-H1, Jamba, LFM2: attention beside a scan or a convolution) have attention
layers and are left to the probes (:mod:`polyrl.modeling.probes`), which find the leak.
"""

from __future__ import annotations

import torch

__all__ = ["attention_free_mixers", "attention_free_refusal"]


def _has_attention(model: torch.nn.Module) -> bool:
    # transformers names every attention module *Attention (LlamaAttention, JambaAttention,
    # FalconH1Attention, Lfm2Attention …); a state-space layer's module is its *Mixer.
    return any("Attention" in type(module).__name__ for module in model.modules())


def attention_free_mixers(model: torch.nn.Module) -> list[str] | None:
    """The class names of the token mixers of a model with no attention layer (``["MambaMixer"]``
    for a Mamba), or None when the model has attention. The mixers are the modules each decoder
    layer holds besides its norms and projections; ``[]`` when the model has no ``layers`` list."""
    if _has_attention(model):
        return None
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else model
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        return []
    plain = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Dropout, torch.nn.Identity)
    names = {
        type(child).__name__
        for layer in layers
        for child in layer.children()
        if not isinstance(child, plain) and "Norm" not in type(child).__name__
    }
    return sorted(names)


def attention_free_refusal(model: torch.nn.Module, *, what: str) -> str | None:
    """Why ``what`` (the packed form, e.g. "rows packed end to end") cannot apply to a model with
    no attention layer, naming its mixers; None when the model has attention."""
    mixers = attention_free_mixers(model)
    if mixers is None:
        return None
    named = ", ".join(mixers) if mixers else "a mixer other than attention"
    return (
        f"{type(model).__name__} has no attention layer: its layers mix tokens by a state-space scan ({named}) "
        f"that runs along the whole sequence, so {what} would carry one's state into the next; no attention "
        "implementation changes that"
    )
