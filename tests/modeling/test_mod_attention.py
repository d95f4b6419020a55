"""A bf16 learner on CPU computes attention in fp32 (polyrl.modeling.attention): the kernel gets fp32
inputs under autocast, fp32 models are untouched, and the values and gradients stay those of the
bf16 model up to bf16 rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from polyrl.modeling.attention import FP32_CPU_SDPA, attend_in_fp32_on_cpu
from polyrl.modeling.shared_prompts import sharing_refusal


@pytest.fixture
def policy(random_policy_dir):
    return AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32)


@pytest.fixture
def kernel_dtypes(monkeypatch):
    """The dtypes the sdpa kernel computes in, each call (transformers calls it by
    ``torch.nn.functional.scaled_dot_product_attention``): with CPU autocast on at the call,
    autocast casts q, k and v to its bf16 before the kernel."""
    seen: list[tuple[torch.dtype, ...]] = []
    real = F.scaled_dot_product_attention

    def recording(query, key, value, *args, **kwargs):
        autocast = torch.is_autocast_enabled("cpu")
        seen.append(tuple(torch.get_autocast_dtype("cpu") if autocast else t.dtype for t in (query, key, value)))
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return seen


def _batch():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 40, (4, 18), generator=generator)
    mask = torch.ones_like(ids)
    mask[:2, :5] = 0  # left padding: the kernel gets a boolean mask
    return ids, mask


def _logits_and_grads(model, autocast: bool):
    ids, mask = _batch()
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
    logits.logsumexp(-1)[mask.bool()].sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logits.detach()[mask.bool()], grads


def test_the_kernel_runs_in_fp32_under_bf16_autocast(policy, kernel_dtypes):
    _logits_and_grads(policy, autocast=True)
    # Plain sdpa under autocast: the kernel (forward and its slow backward) runs in bf16.
    assert kernel_dtypes and all(dtypes == (torch.bfloat16,) * 3 for dtypes in kernel_dtypes)
    kernel_dtypes.clear()
    assert attend_in_fp32_on_cpu(policy) and policy.config._attn_implementation == FP32_CPU_SDPA
    _logits_and_grads(policy, autocast=True)
    assert kernel_dtypes and all(dtypes == (torch.float32,) * 3 for dtypes in kernel_dtypes)


def test_fp32_models_are_unchanged_and_bf16_values_stay_within_rounding(policy):
    fp32_logits, fp32_grads = _logits_and_grads(policy, autocast=False)
    bf16_logits, bf16_grads = _logits_and_grads(policy, autocast=True)
    attend_in_fp32_on_cpu(policy)
    same_logits, same_grads = _logits_and_grads(policy, autocast=False)
    assert torch.equal(same_logits, fp32_logits) and torch.equal(same_grads, fp32_grads)  # a pass-through in fp32
    up_logits, up_grads = _logits_and_grads(policy, autocast=True)
    # bf16 keeps 8 bits of mantissa: logits of magnitude ~1 move by ~1e-2 either way.
    assert (up_logits - fp32_logits).abs().max() < 5e-2 and (bf16_logits - fp32_logits).abs().max() < 5e-2
    assert not torch.equal(up_logits, bf16_logits)  # the kernel's dtype did change
    assert F.cosine_similarity(up_grads, fp32_grads, dim=0) > 0.999


def test_only_sdpa_text_models_switch_and_share_prompts_still_applies(random_policy_dir):
    eager = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32, attn_implementation="eager")
    assert not attend_in_fp32_on_cpu(eager) and eager.config._attn_implementation == "eager"
    switched = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32)
    assert attend_in_fp32_on_cpu(switched)
    assert sharing_refusal(switched, takes_images=False) is None  # it takes sdpa's 4-D boolean masks
