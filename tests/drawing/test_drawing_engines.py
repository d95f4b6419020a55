"""Both rollout engines mark the palette tokens a drawing policy writes between <img> markers as image."""

import pytest

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.engines.base import build_rollout_engine
from polyrl.engines.modality_marks import modality_string
from polyrl.policies.text import build_random_text_model_dir
from polyrl.rewards import RewardBatch
from polyrl.rewards.builtins.drawing import Drawing
from polyrl.tasks import drawing

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm]

ROWS = drawing.read_rows("test")[:6]


def check_marks(groups):
    completions = [c for group in groups for c in group]
    batch = RewardBatch(
        prompts=["p"] * len(completions),
        completions=[c.text for c in completions],
        references=[[ROWS[0]["answer"]]] * len(completions),
    )
    well_formed = 0
    for completion, detail in zip(completions, Drawing().details(batch)):
        marks = modality_string(completion.completion_token_modalities)
        assert len(marks) == len(completion.completion_ids)
        if detail.reason is None:  # <img> + 9 palette tokens + </img> + caption/EOS
            well_formed += 1
            assert marks == "T" + "I" * 9 + "T" * (len(marks) - 10), (completion.text, marks)
        else:  # image tokens only ever sit between the markers
            assert marks.count("I") <= 9
    assert well_formed >= len(completions) // 2  # the warmed-up policy mostly draws well-formed grids


def test_hf_engine_marks_image_tokens(drawing_policy_dir):
    engine = build_rollout_engine("hf", str(drawing_policy_dir), seed=0)
    assert engine.modality_rule is not None
    groups = engine.generate(
        [PromptSample(prompt=r["prompt"]) for r in ROWS], SamplingSettings(n=4, temperature=1.0, max_tokens=64, seed=1)
    )
    check_marks(groups)


@pytest.mark.slow
def test_vllm_engine_marks_image_tokens(drawing_policy_dir):
    engine = build_rollout_engine("vllm", str(drawing_policy_dir), seed=0, kv_cache_gb=0.25)
    try:
        assert engine.modality_rule is not None
        groups = engine.generate(
            [PromptSample(prompt=r["prompt"]) for r in ROWS], SamplingSettings(n=4, temperature=1.0, max_tokens=64, seed=1)
        )
        check_marks(groups)
        # the detokenised text keeps the palette tokens (they are not special tokens)
        assert any("<img><" in c.text for group in groups for c in group)
    finally:
        engine.close()


def test_a_model_without_a_rule_generates_text_only(tmp_path):
    directory = build_random_text_model_dir(tmp_path / "model", "0.3m", seed=0)
    engine = build_rollout_engine("hf", str(directory), seed=0)
    assert engine.modality_rule is None
    groups = engine.generate([PromptSample(prompt="draw")], SamplingSettings(n=2, temperature=1.0, max_tokens=8, seed=0))
    assert all(set(c.completion_token_modalities) == {"text"} for c in groups[0])
