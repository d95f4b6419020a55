"""``rollout.kv_cache_gb: auto``: the KV cache one generation call holds (polyrl/engines/kv_cache.py),
by hand on model configs."""

from __future__ import annotations

from types import SimpleNamespace

from polyrl.engines.kv_cache import KvCacheNeed, kv_bytes_per_token, kv_cache_bytes

# SmolLM2-135M-Instruct: 30 layers, 9 query heads of 576 / 9 = 64 dims, 3 key/value heads.
SMOLLM2 = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)


def test_bytes_per_token_count_keys_and_values_of_every_layer():
    assert kv_bytes_per_token(SMOLLM2, "float32") == 30 * 2 * 3 * 64 * 4 == 46_080
    assert kv_bytes_per_token(SMOLLM2, "bfloat16") == 23_040
    # An explicit head_dim (Qwen3, Gemma) wins over hidden / heads; no num_key_value_heads: multi-head attention.
    qwen3_like = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, hidden_size=128, head_dim=48)
    assert kv_bytes_per_token(qwen3_like, "float32") == 2 * 2 * 4 * 48 * 4 == 3_072


def test_cache_holds_every_sequence_in_whole_blocks_plus_one():
    # 8 prompts x 8 samples of <= 50 + 24 tokens: one 128-token block each, + 1 = 65 blocks;
    # 65 * 128 * 46,080 B = 383,385,600 B (366 MiB), where the fixed setting was 1 GiB or 0.5 GiB.
    need = KvCacheNeed(sequences=64, tokens_per_sequence=74)
    assert kv_cache_bytes(SMOLLM2, "float32", need, max_model_len=512, block_size=128) == 65 * 128 * 46_080 == 383_385_600
    # 16-token blocks (CUDA): ceil(74 / 16) = 5 blocks per sequence, 64 * 5 + 1 = 321 blocks.
    assert kv_cache_bytes(SMOLLM2, "bfloat16", need, max_model_len=512, block_size=16) == 321 * 16 * 23_040


def test_one_longest_sequence_always_fits_and_none_is_longer_than_the_model_allows():
    # 2 sequences of 10 tokens need 2 blocks of 16, but vLLM must hold one max_model_len (512) sequence:
    # 512 / 16 = 32 blocks, + 1.
    assert kv_cache_bytes(SMOLLM2, "float32", KvCacheNeed(2, 10), max_model_len=512, block_size=16) == 33 * 16 * 46_080
    # A sequence is cut at max_model_len: 4 sequences of (at most) 128 tokens = 4 blocks of 128, + 1.
    assert kv_cache_bytes(SMOLLM2, "float32", KvCacheNeed(4, 10_000), max_model_len=128, block_size=128) == 5 * 128 * 46_080


def test_the_setting_becomes_a_size_or_a_need():
    from polyrl.engines.kv_cache import kv_cache_request

    assert kv_cache_request(0.5, sequences=64, max_tokens=24, prompt_lengths=[50]) == {"kv_cache_gb": 0.5}
    assert kv_cache_request("auto", sequences=64, max_tokens=24, prompt_lengths=[12, 50, 31]) == {
        "kv_cache_need": KvCacheNeed(sequences=64, tokens_per_sequence=74)
    }  # the longest prompt, 50, + 24
    # Periodic evaluation's batches are not sized here: the former fixed 1 GiB.
    assert kv_cache_request("auto", sequences=64, max_tokens=24, prompt_lengths=[50], periodic_eval=True) == {"kv_cache_gb": 1.0}


def test_prompt_lengths_are_the_ids_an_engine_sends():
    from polyrl.core.types import PromptSample
    from polyrl.engines.kv_cache import prompt_lengths
    from polyrl.policies.text import build_char_tokenizer

    samples = [PromptSample(prompt="12+7="), PromptSample(prompt="ignored", prompt_ids=[1, 2, 3, 4, 5, 6, 7, 8])]
    # The char tokenizer: one id per character, no special tokens added ("12+7=": 5 ids).
    assert sorted(prompt_lengths(samples, build_char_tokenizer(), takes_images=False, max_model_len=512)) == [5, 8]
    assert prompt_lengths(samples, None, takes_images=True, max_model_len=512) == [512]
