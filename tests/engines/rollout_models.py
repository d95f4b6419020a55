"""Models and inputs shared by the rollout engine tests (hf and vLLM)."""

from __future__ import annotations

import copy

import torch

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.modeling.logprobs import logprob_gap, pack_completions, token_logprobs
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm

PROMPTS = [PromptSample(prompt="12+7="), PromptSample(prompt="hello"), PromptSample(prompt="a"), PromptSample(prompt="(3*4)-5=")]
SETTINGS = SamplingSettings(n=4, temperature=1.0, max_tokens=24, seed=11)


def eos_prone_model(tied: bool):
    """A random 0.3M model that ends about half of its 24-token samples with EOS.

    Residual dimension 0 is a constant 10 (every token embeds it, no layer writes it), so the
    final hidden state always has a large component 0 and the EOS row of the head gets a
    fixed logit bonus through it. Both finish reasons then occur in a handful of samples.
    """
    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(tokenizer, "0.3m", seed=0, tie_word_embeddings=tied).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 10.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        model.lm_head.weight[tokenizer.eos_token_id, 0] += 0.08  # same tensor as the embedding when tied
    return model, tokenizer


def perturbed(model, seed: int = 1, scale: float = 0.05):
    """A copy with every parameter (embeddings, head, norms, projections) moved by N(0, scale^2)."""
    new = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in new.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return new


def flat(groups):
    return [c for group in groups for c in group]


def gap_vs(model, completions, temperature: float, pad_id: int) -> float:
    """The sampler/learner log-prob gap of ``completions`` scored by ``model``."""
    batch = pack_completions(completions, pad_token_id=pad_id)
    with torch.no_grad():
        learner, _ = token_logprobs(model, batch, temperature=temperature)
    return logprob_gap(batch.sampling_logprobs, learner, batch.response_mask)
