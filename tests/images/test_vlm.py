"""The tiny Idefics3 policy, the HF engine on image prompts and the learner's image log-prob path."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.engines.hf_engine import HFRolloutEngine
from polyrl.engines.image_prompts import banned_token_ids, model_takes_images
from polyrl.modeling.logprobs import collate_image_inputs, logprob_gap, pack_completions, token_logprobs
from polyrl.policies import vlm
from polyrl.policies.cache import INFO_FILE
from polyrl.tasks import scenes


def test_tiny_vlm_has_four_image_tokens_per_image_and_loads_back(vlm_dir):
    processor = AutoProcessor.from_pretrained(str(vlm_dir))
    model = AutoModelForImageTextToText.from_pretrained(str(vlm_dir))
    assert model_takes_images(vlm_dir)
    assert 500_000 < sum(p.numel() for p in model.parameters()) < 750_000  # 592,064 measured
    ids = processor(text=["<image>Q"], images=[[scenes.render(scenes.make_scene(0))]], add_special_tokens=False)["input_ids"][0]
    tokens = processor.tokenizer.convert_ids_to_tokens(ids)
    # 32x32 image, patch 8 -> 16 patches, pixel shuffle 2x2 -> 4 image tokens, no splitting.
    assert tokens == ["<fake_token_around_image>", "<global-img>", *["<image>"] * 4, "<fake_token_around_image>", "Q"]
    assert vlm.image_seq_len() == 4


def test_warm_up_is_cached_by_its_settings(tmp_path):
    first = vlm.warm_vlm_policy(tmp_path, steps=2, eval_prompts=4)
    info = json.loads((first / INFO_FILE).read_text())
    assert info["steps"] == 2 and 0.0 <= info["greedy_accuracy"] <= 1.0 and info["train_seconds"] > 0
    stamp = (first / INFO_FILE).stat().st_mtime_ns
    assert vlm.warm_vlm_policy(tmp_path, steps=2, eval_prompts=4) == first
    assert (first / INFO_FILE).stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert vlm.warm_vlm_policy(tmp_path, steps=3, eval_prompts=4) != first


def test_banned_ids_are_the_image_and_special_tokens_not_eos():
    tokenizer = vlm.build_vlm_tokenizer()
    banned = set(banned_token_ids(tokenizer))
    names = {tokenizer.convert_ids_to_tokens(i) for i in banned}
    assert {
        "<image>",
        "<fake_token_around_image>",
        "<global-img>",
        "<end_of_utterance>",
        "<row_1_col_1>",
        "<row_6_col_6>",
    } <= names
    assert {tokenizer.pad_token, tokenizer.bos_token, tokenizer.unk_token} <= names
    assert tokenizer.eos_token_id not in banned
    assert len(banned) == 4 + 36 + 3  # image tokens, row/col tiles, pad/bos/unk


def test_collate_pads_per_row_images_and_concatenates_flat_ones():
    one = {"pixel_values": torch.ones(1, 1, 3, 2, 2), "pixel_attention_mask": torch.ones(1, 1, 2, 2, dtype=torch.bool)}
    two = {"pixel_values": torch.full((1, 2, 3, 2, 2), 2.0), "pixel_attention_mask": torch.ones(1, 2, 2, 2, dtype=torch.bool)}
    out = collate_image_inputs([one, None, two])
    assert out["pixel_values"].shape == (3, 2, 3, 2, 2)
    # Row 0: its image then a zero image (dropped by Idefics3); row 1 (text): all zeros.
    assert out["pixel_values"][0, 0].eq(1).all() and out["pixel_values"][0, 1].eq(0).all()
    assert out["pixel_values"][1].eq(0).all() and out["pixel_values"][2].eq(2).all()
    flat = collate_image_inputs(
        [
            {"pixel_values": torch.ones(4, 6), "image_grid_thw": torch.tensor([[1, 2, 2]])},
            None,
            {"pixel_values": torch.zeros(8, 6), "image_grid_thw": torch.tensor([[1, 2, 4]])},
        ]
    )
    assert flat["pixel_values"].shape == (12, 6) and flat["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 4]]
    assert collate_image_inputs([None, None]) == {}


@pytest.fixture(scope="module")
def hf_engine(vlm_dir):
    engine = HFRolloutEngine(str(vlm_dir), seed=0)
    yield engine
    engine.close()


def _mixed_prompts(scene_prompts):
    return [*scene_prompts(2), PromptSample(prompt="Q: 2+2?\nA:", references=["4"])]


def test_hf_engine_mixes_image_and_text_prompts_and_stays_in_sync_with_the_learner(hf_engine, vlm_dir, scene_prompts):
    prompts = _mixed_prompts(scene_prompts)
    settings = SamplingSettings(n=3, temperature=1.0, max_tokens=10, seed=1)
    groups = hf_engine.generate(prompts, settings)
    processor = AutoProcessor.from_pretrained(str(vlm_dir))
    banned = set(hf_engine.banned_token_ids)
    for prompt, group in zip(prompts, groups):
        assert len(group) == 3
        for c in group:
            assert not banned & set(c.completion_ids)
            assert c.banned_token_ids == hf_engine.banned_token_ids
            if prompt.images:
                want = processor(text=[prompt.prompt], images=[prompt.images], add_special_tokens=False)["input_ids"][0]
                assert c.prompt_ids == list(want)
                assert c.prompt_token_modalities.count("image") == 7  # 2 wrappers + <global-img> + 4 image tokens
                assert c.image_inputs["pixel_values"].shape == (1, 1, 3, 32, 32)
            else:
                assert c.image_inputs is None and c.prompt_token_modalities is None
    completions = [c for g in groups for c in g]
    batch = pack_completions(completions, pad_token_id=processor.tokenizer.pad_token_id)
    learner = AutoModelForImageTextToText.from_pretrained(str(vlm_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs, _ = token_logprobs(learner, batch)
    gap = logprob_gap(batch.sampling_logprobs, logprobs, batch.response_mask)
    assert gap < 1e-5, gap
    # Image tokens are prompt positions: every scored position is at or after the last prompt token.
    for row, c in enumerate(completions):
        assert int(batch.response_index[row][batch.response_mask[row].bool()].min()) == len(c.prompt_ids) - 1


def test_learner_batch_equals_rows_alone_and_uses_the_image(hf_engine, vlm_dir, scene_prompts):
    groups = hf_engine.generate(_mixed_prompts(scene_prompts), SamplingSettings(n=2, temperature=1.0, max_tokens=8, seed=2))
    completions = [c for g in groups for c in g]
    pad = hf_engine.tokenizer.pad_token_id
    learner = AutoModelForImageTextToText.from_pretrained(str(vlm_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        together, _ = token_logprobs(learner, pack_completions(completions, pad_token_id=pad))
        for row, c in enumerate(completions):
            alone, _ = token_logprobs(learner, pack_completions([c], pad_token_id=pad))
            assert torch.allclose(together[row, : alone.shape[1]], alone[0], atol=1e-5)
        # Another scene's pixels under the same ids: the log-probs move, so the image is used.
        swapped = [c for c in completions if c.image_inputs is not None]
        other = hf_engine._encode_images(PromptSample(prompt="<image>", images=[scenes.render(scenes.make_scene(5))]))[2]
        batch = pack_completions(swapped[:1], pad_token_id=pad)
        batch.image_inputs = [other]
        moved, _ = token_logprobs(learner, batch)
        base, _ = token_logprobs(learner, pack_completions(swapped[:1], pad_token_id=pad))
    assert (moved - base).abs().max() > 1e-3


def test_learner_masks_the_banned_ids_like_the_sampler(hf_engine, vlm_dir, scene_prompts):
    completion = hf_engine.generate(scene_prompts(1), SamplingSettings(n=1, temperature=1.0, max_tokens=6, seed=3))[0][0]
    learner = AutoModelForImageTextToText.from_pretrained(str(vlm_dir), dtype=torch.float32).eval()
    batch = pack_completions([completion], pad_token_id=hf_engine.tokenizer.pad_token_id)
    with torch.no_grad():
        masked, _ = token_logprobs(learner, batch)
        batch.banned_token_ids = None
        unmasked, _ = token_logprobs(learner, batch)
        # By hand: log p over the allowed ids only = log p(all) - log(1 - P(banned)).
        ids = completion.prompt_ids + completion.completion_ids
        logits = learner(input_ids=torch.tensor([ids]), **completion.image_inputs).logits[0].float()
        probs = logits.softmax(-1)[len(completion.prompt_ids) - 1 : len(ids) - 1]
        banned_mass = probs[:, list(completion.banned_token_ids)].sum(-1)
    n = len(completion.completion_ids)
    assert torch.allclose(masked[0, :n], unmasked[0, :n] - torch.log1p(-banned_mass), atol=1e-5)
    assert (masked[0, :n] - unmasked[0, :n]).abs().max() > 0  # the mask did something
