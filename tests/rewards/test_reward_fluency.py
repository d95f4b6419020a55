"""Perplexity fluency against a manual per-sample computation with the tiny Qwen3-architecture model."""

import math

import pytest
import torch

from polyrl.policies.text import build_random_text_model_dir
from polyrl.rewards import RewardBatch, RewardConfigError
from polyrl.rewards.builtins import PerplexityFluency


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_random_text_model_dir(tmp_path_factory.mktemp("ppl_model"), "0.3m"))


def manual_perplexity(model, tokenizer, prompt, completion):
    """Unpadded single-sequence forward; mean NLL over the completion tokens."""
    prompt_ids = tokenizer(prompt)["input_ids"] or [tokenizer.bos_token_id]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
    nll = [-float(log_probs[t - 1, ids[0, t]]) for t in range(len(prompt_ids), ids.shape[1])]
    return math.exp(sum(nll) / len(nll))


PROMPTS = ["What is 2+2?", "Say hello.", "", "Count: 1 2 3"]
COMPLETIONS = ["4", "Hello there, friend! How are you today?", "no prompt at all", "4 5 6 7 8 9 10 11 12"]


def test_batched_matches_manual(model_dir):
    module = PerplexityFluency(model_path=model_dir, batch_size=3, device="cpu")  # 4 samples -> 2 padded micro-batches
    module.setup()
    batch = RewardBatch(prompts=PROMPTS, completions=COMPLETIONS)
    ppl = module.perplexities(batch)
    rewards = module.score(batch)
    for i, (prompt, completion) in enumerate(zip(PROMPTS, COMPLETIONS)):
        expected_ppl = manual_perplexity(module.model, module.tokenizer, prompt, completion)
        assert ppl[i] == pytest.approx(expected_ppl, rel=1e-5)
        # reward = min(0, (50 - ppl)/10)
        assert rewards[i] == pytest.approx(min(0.0, (50.0 - expected_ppl) / 10.0), rel=1e-5, abs=1e-7)
    # a random 0.3M model over a ~100-symbol vocabulary is far above ppl 50: every reward < 0
    assert all(r < -1.0 for r in rewards)


def test_tau_scale_and_unscorable(model_dir):
    batch = RewardBatch(prompts=["Hi", "Hi"], completions=["there", ""])
    loose = PerplexityFluency(model_path=model_dir, tau=1e9, device="cpu")
    # far below tau -> no penalty; an empty completion has no token to score -> None
    assert loose.score(batch) == [0.0, None]
    base = PerplexityFluency(model_path=model_dir, device="cpu")
    wide = PerplexityFluency(model_path=model_dir, scale=20, device="cpu")
    ppl = base.perplexities(batch)[0]
    assert base.score(batch)[0] == pytest.approx((50 - ppl) / 10, rel=1e-9)
    assert wide.score(batch)[0] == pytest.approx((50 - ppl) / 20, rel=1e-9)


def test_long_prompt_is_cut_from_the_left(model_dir):
    module = PerplexityFluency(model_path=model_dir, max_length=16, device="cpu")
    batch = RewardBatch(prompts=["x" * 100 + "tail_of_it"], completions=["abcdef"])
    # 16 tokens kept: the last 10 prompt characters + 6 completion characters
    expected = manual_perplexity(module.model or (module.setup() or module.model), module.tokenizer, "tail_of_it", "abcdef")
    assert module.perplexities(batch)[0] == pytest.approx(expected, rel=1e-5)


def test_needs_model_path():
    with pytest.raises(RewardConfigError, match="needs params.model_path"):
        PerplexityFluency().setup()
    with pytest.raises(RewardConfigError, match="scale"):
        PerplexityFluency(scale=0)
