"""pack_completions / token_logprobs / logprob_gap against naive per-sample loops."""

from __future__ import annotations

import pytest
import torch

from polyrl.core.types import Completion
from polyrl.modeling.logprobs import PackedBatch, logprob_gap, pack_completions, token_logprobs
from polyrl.policies.text import build_char_tokenizer, build_tiny_qwen2

PAD = 0


@pytest.fixture(scope="module")
def model():
    tokenizer = build_char_tokenizer()
    return build_tiny_qwen2(tokenizer, "0.3m", seed=3).eval()


def _completions() -> list[Completion]:
    # Different prompt and completion lengths, one empty completion.
    rows = [([5, 6, 7], [8, 9, 10, 11]), ([12], [13, 14]), ([15, 16, 17, 18, 19], [20]), ([21, 22], [])]
    return [
        Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-0.5 * (i + 1)] * len(c), finish_reason="length")
        for i, (p, c) in enumerate(rows)
    ]


def _naive(model, completions, temperature):
    """One unpadded forward per completion; the log-prob of each completion token."""
    logps, entropies = [], []
    for c in completions:
        ids = torch.tensor([c.prompt_ids + c.completion_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float() / temperature
        logp = torch.log_softmax(logits, -1)
        n_prompt = len(c.prompt_ids)
        positions = range(n_prompt - 1, n_prompt - 1 + len(c.completion_ids))
        logps.append([float(logp[pos, tok]) for pos, tok in zip(positions, c.completion_ids)])
        entropies.append([float(-(logp[pos].exp() * logp[pos]).sum()) for pos in positions])
    return logps, entropies


def test_pack_completions_layout():
    batch = pack_completions(_completions(), pad_token_id=PAD)
    assert isinstance(batch, PackedBatch)
    # S = max(3+4, 1+2, 5+1, 2+0) = 7; T = max(4, 2, 1, 0) = 4
    assert batch.input_ids.shape == (4, 7) and batch.response_mask.shape == (4, 4)
    assert batch.input_ids[0].tolist() == [5, 6, 7, 8, 9, 10, 11]
    assert batch.input_ids[1].tolist() == [12, 13, 14, PAD, PAD, PAD, PAD]  # right-padded
    assert batch.attention_mask[1].tolist() == [1, 1, 1, 0, 0, 0, 0]
    assert batch.response_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    # Completion token t of row 0 is predicted at position len(prompt)-1+t = 2, 3, 4, 5.
    assert batch.response_index[0].tolist() == [2, 3, 4, 5]
    assert batch.response_index[1, :2].tolist() == [0, 1]
    assert batch.completion_ids[2].tolist() == [20, PAD, PAD, PAD]
    # input_ids at response_index + 1 are the completion tokens
    mask = batch.response_mask.bool()
    shifted = torch.gather(batch.input_ids, 1, (batch.response_index + 1).clamp(max=6))
    assert torch.equal(shifted[mask], batch.completion_ids[mask])
    assert batch.sampling_logprobs[1].tolist() == [-1.0, -1.0, 0.0, 0.0]


def test_pack_rejects_misaligned_logprobs():
    bad = Completion(prompt_ids=[1], completion_ids=[2, 3], text="", sampling_logprobs=[-1.0], finish_reason="stop")
    with pytest.raises(ValueError, match="1 sampling log-probs for 2"):
        pack_completions([bad], pad_token_id=PAD)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_naive_loop(model, temperature):
    completions = _completions()
    batch = pack_completions(completions, pad_token_id=PAD)
    with torch.no_grad():
        logp, entropy = token_logprobs(model, batch, temperature=temperature, compute_entropy=True)
    naive_logp, naive_entropy = _naive(model, completions, temperature)
    for row, (expected_lp, expected_h) in enumerate(zip(naive_logp, naive_entropy)):
        n = len(expected_lp)
        torch.testing.assert_close(logp[row, :n], torch.tensor(expected_lp), atol=1e-5, rtol=0)
        torch.testing.assert_close(entropy[row, :n], torch.tensor(expected_h), atol=1e-5, rtol=0)
        assert torch.all(logp[row, n:] == 0) and torch.all(entropy[row, n:] == 0)


def test_full_forward_fallback_matches_hidden_state_path(model, monkeypatch):
    """Models with post-head logit transforms take the full forward; same numbers for Qwen2."""
    batch = pack_completions(_completions(), pad_token_id=PAD)
    with torch.no_grad():
        fast, _ = token_logprobs(model, batch)
        monkeypatch.setattr(model.config, "final_logit_softcapping", 30.0, raising=False)
        slow, _ = token_logprobs(model, batch)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=0)


def test_token_logprobs_gradients_flow_only_from_response(model):
    batch = pack_completions(_completions(), pad_token_id=PAD)
    model.zero_grad()
    logp, entropy = token_logprobs(model, batch, compute_entropy=True)
    (logp.sum() + entropy.sum()).backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad()


def test_microbatch_select_gives_same_logprobs(model):
    batch = pack_completions(_completions(), pad_token_id=PAD)
    with torch.no_grad():
        full, _ = token_logprobs(model, batch)
        part, _ = token_logprobs(model, batch.select([0, 2]))
    torch.testing.assert_close(part, full[[0, 2]], atol=1e-6, rtol=0)


def test_logprob_gap_hand_computed():
    completions = _completions()
    batch = pack_completions(completions, pad_token_id=PAD)
    learner = torch.zeros_like(batch.sampling_logprobs)
    # sampler values: row0 4 x -0.5, row1 2 x -1.0, row2 1 x -1.5, row3 none
    # mean |.| = (4*0.5 + 2*1.0 + 1*1.5) / 7 = 5.5 / 7
    assert logprob_gap(completions, learner, batch.response_mask) == pytest.approx(5.5 / 7)
    assert logprob_gap(batch.sampling_logprobs, learner, batch.response_mask) == pytest.approx(5.5 / 7)
