"""vLLM on image prompts with the tiny Idefics3: expanded prompt ids, sync, encoder cache, mixed batches."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.modeling.logprobs import logprob_gap, pack_completions, token_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm_engine(vlm_dir):
    from polyrl.engines.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(str(vlm_dir), seed=0, max_model_len=256, kv_cache_gb=0.25)
    yield engine
    engine.close()


def _gap(completions, model, pad):
    batch = pack_completions(completions, pad_token_id=pad)
    with torch.no_grad():
        learner, _ = token_logprobs(model, batch)
    return logprob_gap(batch.sampling_logprobs, learner, batch.response_mask)


def test_vllm_returns_the_processors_ids_and_matches_the_learner_on_a_mixed_batch(vllm_engine, vlm_dir, scene_prompts):
    prompts = [*scene_prompts(4), PromptSample(prompt="Q: 2+2?\nA:")]
    groups = vllm_engine.generate(prompts, SamplingSettings(n=4, temperature=1.0, max_tokens=10, seed=0))
    processor = AutoProcessor.from_pretrained(str(vlm_dir))
    banned = set(vllm_engine.banned_token_ids)
    for prompt, group in zip(prompts, groups):
        for c in group:
            assert not banned & set(c.completion_ids)
            if prompt.images:
                # vLLM got ONE <image> and expanded it itself: its ids are the processor's expanded ids.
                want = processor(text=[prompt.prompt], images=[prompt.images], add_special_tokens=False)["input_ids"][0]
                assert c.prompt_ids == want and c.prompt_ids.count(processor.image_token_id) == 4
            else:
                assert c.image_inputs is None and processor.image_token_id not in c.prompt_ids
    learner = AutoModelForImageTextToText.from_pretrained(str(vlm_dir), dtype=torch.float32).eval()
    gap = _gap([c for g in groups for c in g], learner, processor.tokenizer.pad_token_id)
    assert gap < 1e-4, gap


def test_sync_of_new_vision_weights_reaches_image_features(vllm_engine, vlm_dir, scene_prompts):
    """The same images before and after a sync: without resetting vLLM's encoder cache the old
    vision tower's features would be served again (DESIGN.md measured a gap of 0.67)."""
    prompts = scene_prompts(3)
    settings = SamplingSettings(n=4, temperature=1.0, max_tokens=8, seed=5)
    vllm_engine.generate(prompts, settings)  # fills the encoder cache with these images' features
    learner = AutoModelForImageTextToText.from_pretrained(str(vlm_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        for name, parameter in learner.named_parameters():
            if "vision_model" in name or "connector" in name:
                parameter.add_(torch.randn_like(parameter) * 0.5)
    vllm_engine.sync_weights(learner.named_parameters())
    completions = [c for g in vllm_engine.generate(prompts, settings) for c in g]
    pad = vllm_engine.tokenizer.pad_token_id
    assert _gap(completions, learner, pad) < 1e-4
    stale = AutoModelForImageTextToText.from_pretrained(str(vlm_dir), dtype=torch.float32).eval()
    assert _gap(completions, stale, pad) > 1e-2  # the change was large enough to be seen
    vllm_engine.sync_weights(stale.named_parameters())  # leave the module's engine as it was
