"""``train.fused_norms``: RMSNorm layers replaced by torch's fused kernel compute the same values
and gradients, and a norm written differently (Gemma's ``1 + weight``) is left as it is."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from polyrl.algos.logprobs import pack_completions, token_logprobs
from polyrl.core.types import Completion
from polyrl.roles.fused_norms import fuse_rms_norms
from tests.roles.learner_helpers import built


class PlainRMSNorm(torch.nn.Module):
    """Llama/Qwen's norm: weight · x / √(mean x² + ε)."""

    def __init__(self, weight: list[float], eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(weight))
        self.variance_epsilon = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


class GemmaStyleRMSNorm(PlainRMSNorm):
    """Gemma's norm scales by (1 + weight): the fused kernel would compute something else."""

    def forward(self, x):
        return (1.0 + self.weight) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


def test_fused_norm_hand_computed():
    norm = PlainRMSNorm([2.0, 0.5], eps=0.0)
    assert fuse_rms_norms(norm) == (1, 0)
    out = norm(torch.tensor([[3.0, 4.0]]))
    # mean x² = (9 + 16) / 2 = 12.5, 1/√12.5 = 0.2828427; [3·0.2828427·2, 4·0.2828427·0.5] = [1.6970563, 0.5656854]
    assert torch.allclose(out, torch.tensor([[1.6970563, 0.5656854]]), rtol=0, atol=1e-6)


def test_a_norm_the_kernel_does_not_reproduce_is_kept():
    norm = GemmaStyleRMSNorm([0.1, -0.2, 0.3], eps=1e-6)
    own_forward = norm.forward
    assert fuse_rms_norms(torch.nn.Sequential(norm, PlainRMSNorm([1.0, 1.0, 1.0], eps=1e-6))) == (1, 1)
    assert norm.forward == own_forward


def test_fused_policy_gives_the_same_logprobs_and_gradients(random_policy_dir):
    reference = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32).eval()
    fused = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32).eval()
    norms = sum(type(m).__name__.endswith("RMSNorm") for m in fused.modules())
    assert fuse_rms_norms(fused) == (norms, 0) and norms > 0
    completions = [Completion(prompt_ids=[5, 6, 7], completion_ids=[8 + (i + j) % 30 for j in range(n)], text="",
                              sampling_logprobs=[], finish_reason="length") for i, n in enumerate([6, 11, 3])]
    batch = pack_completions(completions, pad_token_id=0)
    results = []
    for model in (reference, fused):
        logprobs, _ = token_logprobs(model, batch)
        logprobs.sum().backward()
        results.append((logprobs.detach(), {name: p.grad for name, p in model.named_parameters()}))
    assert torch.allclose(results[1][0], results[0][0], atol=1e-5, rtol=0)
    for name, grad in results[0][1].items():
        assert torch.allclose(results[1][1][name], grad, atol=1e-5, rtol=1e-4), name


def _fused_count(model: torch.nn.Module) -> int:
    return sum(getattr(m.forward, "__name__", "") == "fused_rms_norm_forward" for m in model.modules())


def test_arm_fuses_by_default_and_not_when_off(tmp_path, tiny_experiment):
    with built(tmp_path, tiny_experiment(train={"steps": 1})) as arm:
        assert _fused_count(arm.learner.policy) == sum(type(m).__name__.endswith("RMSNorm") for m in arm.learner.policy.modules()) > 0
    with built(tmp_path / "off", tiny_experiment(train={"steps": 1, "fused_norms": False})) as arm:
        assert _fused_count(arm.learner.policy) == 0
