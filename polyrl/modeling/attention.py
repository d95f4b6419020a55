"""Attention for a bf16 learner on CPU: scaled-dot-product attention computed in fp32.

torch's CPU flash-attention kernel (what ``sdpa`` runs on CPU) has no fast bf16 backward: on a
Xeon with AMX its bf16 backward was several times slower than its fp32 one, a large share of a
bf16 update (docs/benchmarks.md, "bf16"). Under autocast the kernel gets bf16 inputs whatever arrives (rotary embeddings leave q and
k in fp32, v is bf16), so this attention casts q, k and v to fp32 with autocast off around the
kernel and returns the autocast dtype, as ``sdpa`` would. The matmuls around attention still run
in bf16; only the attention kernel runs in fp32, which is also the more exact choice, and the
bf16 update is faster with it than with ``sdpa`` (docs/benchmarks.md).

``sdpa_fp32_on_cpu`` is registered with transformers' attention and mask interfaces and behaves
as ``sdpa`` (same boolean masks, same kernel) except for the dtype the kernel computes in on CPU.
"""

from __future__ import annotations

import torch

FP32_CPU_SDPA = "sdpa_fp32_on_cpu"


def _sdpa_fp32_on_cpu(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    lower = [t.dtype for t in (query, key, value) if t.dtype != torch.float32]
    autocasting = torch.is_autocast_enabled("cpu")
    if query.device.type != "cpu" or not (lower or autocasting):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # Under autocast the inputs arrive mixed (rotary embeddings turn q and k to fp32, v stays
    # bf16) and sdpa would cast all three to bf16; the result leaves in that dtype as before.
    dtype = torch.get_autocast_dtype("cpu") if autocasting else lower[0]
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    with torch.autocast(device_type="cpu", enabled=False):
        output, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)
    return output.to(dtype), weights


def register_fp32_cpu_sdpa() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(FP32_CPU_SDPA, _sdpa_fp32_on_cpu)
    AttentionMaskInterface.register(FP32_CPU_SDPA, sdpa_mask)


def attend_in_fp32_on_cpu(model: torch.nn.Module) -> bool:
    """Switch ``model`` from ``sdpa`` to :data:`FP32_CPU_SDPA`; False (model untouched) when its
    attention is not ``sdpa`` or it is an image-text model (its sub-models choose their own)."""
    config = getattr(model, "config", None)
    if (
        config is None
        or getattr(config, "_attn_implementation", None) != "sdpa"
        or getattr(config, "vision_config", None) is not None
    ):
        return False
    register_fp32_cpu_sdpa()
    model.set_attn_implementation(FP32_CPU_SDPA)
    return model.config._attn_implementation == FP32_CPU_SDPA
