"""Log-probs and entropy computed in chunks of response positions (polyrl.modeling.logprobs): the
same numbers and gradients as one chunk, and a peak memory that does not grow with the batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from polyrl.core.types import Completion
from polyrl.modeling.logprobs import LOGITS_CHUNK_BYTES, pack_completions, positions_per_chunk, token_logprobs
from polyrl.policies.text import build_char_tokenizer, build_tiny_qwen2

PAD = 0
ALL_AT_ONCE = 10**9  # a chunk larger than any batch here: the unchunked computation


@pytest.fixture(scope="module")
def model():
    return build_tiny_qwen2(build_char_tokenizer(), "0.3m", seed=5).eval()


def _batch():
    rows = [
        ([5, 6, 7], [8, 9, 10, 11, 12]),
        ([12], [13, 14]),
        ([15, 16, 17, 18, 19], [20]),
        ([21, 22], []),
        ([30, 31], [32, 33, 34]),
    ]
    completions = [
        Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-1.0] * len(c), finish_reason="length")
        for p, c in rows
    ]
    batch = pack_completions(completions, pad_token_id=PAD)
    batch.banned_token_ids = torch.tensor([3, 4])  # masked to -inf in every chunk alike
    return batch


def test_positions_per_chunk_follows_the_budget():
    # 16 MiB / (4 bytes x 150,000) = 27.96 -> 27 positions; 16 MiB / (4 x 49,152) = 85.3 -> 85
    assert LOGITS_CHUNK_BYTES == 16 * 2**20
    assert positions_per_chunk(150_000) == 27 and positions_per_chunk(49_152) == 85
    assert positions_per_chunk(10**9) == 1  # never zero


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_one_chunk(model, chunk, temperature):
    batch = _batch()
    with torch.no_grad():
        whole, whole_h = token_logprobs(model, batch, temperature=temperature, compute_entropy=True, chunk_positions=ALL_AT_ONCE)
        parts, parts_h = token_logprobs(model, batch, temperature=temperature, compute_entropy=True, chunk_positions=chunk)
    torch.testing.assert_close(parts, whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(parts_h, whole_h, atol=1e-6, rtol=0)
    assert torch.all(parts[~batch.response_mask.bool()] == 0) and torch.all(parts_h[~batch.response_mask.bool()] == 0)


@pytest.mark.parametrize("entropy_grad", [True, False])
def test_chunked_gradients_equal_one_chunk(model, entropy_grad):
    """The chunked backward recomputes each chunk's head and softmax (checkpointing): the same
    gradients as the unchunked graph, with and without the entropy in the loss."""

    def grads(chunk):
        model.zero_grad(set_to_none=True)
        logp, entropy = token_logprobs(model, _batch(), compute_entropy=True, entropy_grad=entropy_grad, chunk_positions=chunk)
        assert entropy.requires_grad is entropy_grad
        loss = (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum() + (0.3 * entropy.sum() if entropy_grad else 0)
        loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    whole, chunked = grads(ALL_AT_ONCE), grads(2)
    assert whole.keys() == chunked.keys() and len(whole) > 5  # every layer gets a gradient
    # The (tied) embedding's gradient sums the head's contributions over the chunks in another
    # order than the whole batch's matmul: float32 reordering, bounded by ~ positions x eps x |g|
    # = 30 x 1.2e-7 x 3.7 = 1.3e-5 here (|g| up to 3.7). With one torch thread one entry differed
    # by 1.5e-6, so 1e-6 was below the rounding; a wrong recomputation differs by far more.
    for name in whole:
        torch.testing.assert_close(chunked[name], whole[name], atol=1e-5, rtol=1e-5, msg=name)
    model.zero_grad(set_to_none=True)


def test_nothing_to_score_keeps_the_graph(model):
    """A micro-batch of empty completions: zeros, still differentiable (its loss backpropagates to 0)."""
    batch = pack_completions(
        [Completion(prompt_ids=[5, 6], completion_ids=[], text="", sampling_logprobs=[], finish_reason="stop")], pad_token_id=PAD
    )
    logp, entropy = token_logprobs(model, batch, compute_entropy=True, chunk_positions=2)
    assert logp.requires_grad and torch.all(logp == 0) and torch.all(entropy == 0)
    logp.sum().backward()
    model.zero_grad(set_to_none=True)


# Measured in a fresh interpreter: torch's CPU tensors come from malloc, which tracemalloc does
# not see, so the peak resident set (VmHWM, reset through /proc/self/clear_refs) is read instead.
# glibc's mmap threshold is pinned low so that a freed large tensor leaves the resident set at
# once: the peak then follows live tensors, not what the allocator keeps for reuse.
_PROBE = textwrap.dedent("""
    import json, sys, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from polyrl.modeling.logprobs import PackedBatch, token_logprobs

    def peak_kib():
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])

    vocab, prompt, length = 150_000, 4, 32
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)).eval()

    def batch(rows):
        ids = torch.randint(0, vocab, (rows, prompt + length))
        return PackedBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=torch.ones(rows, length, dtype=torch.long),
                           response_index=torch.arange(prompt - 1, prompt - 1 + length).expand(rows, -1).contiguous(),
                           completion_ids=ids[:, prompt:].contiguous())

    def peak_mib(rows, chunk):
        model.zero_grad(set_to_none=True)
        b = batch(rows)
        open("/proc/self/clear_refs", "w").write("5")  # the peak restarts from what is resident now
        start = peak_kib()
        logp, entropy = token_logprobs(model, b, compute_entropy=True, chunk_positions=chunk)
        (logp.sum() + 0.1 * entropy.sum()).backward()
        return (peak_kib() - start) / 1024

    peak_mib(1, 8)  # one-off allocations (kernels, thread pools, the gradients' buffers) before measuring
    print(json.dumps({"chunked_64": peak_mib(2, 8), "chunked_128": peak_mib(4, 8), "whole_64": peak_mib(2, 10**9)}))
""")


def test_peak_memory_grows_with_the_chunk_not_the_batch():
    """Vocabulary 150k, forward and backward with the entropy in the loss, 64 and 128 response
    positions. One [positions x vocab] float32 tensor is 64 x 150,000 x 4 B = 36.6 MiB at 64
    positions. Unchunked, the peak holds several of those (measured: 303 MiB), which shows the
    measurement sees them; in chunks of 8 positions (4.6 MiB per tensor) the peak is ~56 MiB
    (mostly the 18 MiB embedding gradient) and the same when the batch doubles."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    one_tensor_64 = 64 * 150_000 * 4 / 2**20  # 36.6 MiB
    assert peaks["whole_64"] > 2 * one_tensor_64, peaks  # the unchunked graph holds several [N, V] tensors
    # Doubling the positions adds 36.6 MiB per [N, V] tensor unchunked; chunked, a fraction of one.
    assert peaks["chunked_128"] - peaks["chunked_64"] < 0.25 * one_tensor_64, peaks
    assert peaks["chunked_128"] < peaks["whole_64"] / 3, peaks
