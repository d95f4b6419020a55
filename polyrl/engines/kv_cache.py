"""The vLLM KV cache sized to what one generation call holds (``rollout.kv_cache_gb: auto``).

On the CPU vLLM reserves its KV cache as one resident allocation of ``kv_cache_memory_bytes``,
whatever the run uses. A training step generates ``prompts_per_step × samples_per_prompt``
sequences of at most (longest prompt + ``max_tokens``) tokens at once, so that is all the cache
needs to hold for every sequence to run in one batch (a larger one is never touched; a smaller
one makes vLLM queue sequences, slower but the same samples). Each sequence takes whole blocks of
``block_size`` tokens; every layer stores a key and a value of ``num_key_value_heads × head_dim``
per token. At least one sequence of ``max_model_len`` tokens must fit (vLLM refuses to start
otherwise), and one block more than needed is kept (vLLM's block pool holds one block back).

SmolLM2-135M-Instruct in fp32: 30 layers × 2 × 3 heads × 64 × 4 B = 46,080 B per token; 64
sequences of ≤ 74 tokens in blocks of 128 (vLLM's CPU default) → 65 blocks, 365 MiB, against a
fixed 1 GiB (the old default) or 0.5 GiB.

The block size is passed to vLLM explicitly with the size (its own default on each platform: 128
on the CPU, 16 on CUDA), so the arithmetic and vLLM's division of the bytes into blocks agree.
Sliding-window layers (Gemma 2/3) are counted as full attention: an upper bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from polyrl.runtime.devices import has_cuda

__all__ = ["KvCacheNeed", "default_block_size", "kv_bytes_per_token", "kv_cache_bytes", "kv_cache_request", "prompt_lengths"]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
AUTO_KV_CACHE_GB_WITH_EVAL = 1.0  # with periodic evaluation, whose batches are not sized here: the former fixed size


@dataclass(frozen=True)
class KvCacheNeed:
    """What one generation call holds: ``sequences`` of at most ``tokens_per_sequence`` tokens."""

    sequences: int
    tokens_per_sequence: int


def default_block_size() -> int:
    """vLLM's default KV block size here: 128 on the CPU backend, 16 on CUDA."""
    return 16 if has_cuda() else 128


def kv_bytes_per_token(text_config: Any, dtype: str) -> int:
    """Bytes of keys and values one token takes over all layers of the model ``text_config``."""
    heads = text_config.num_attention_heads
    kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
    return text_config.num_hidden_layers * 2 * kv_heads * head_dim * DTYPE_BYTES[dtype]


def kv_cache_bytes(text_config: Any, dtype: str, need: KvCacheNeed, *, max_model_len: int, block_size: int) -> int:
    """The cache that holds ``need`` whole (see the module docstring)."""
    tokens = min(need.tokens_per_sequence, max_model_len)
    blocks = max(need.sequences * math.ceil(tokens / block_size), math.ceil(max_model_len / block_size)) + 1
    return blocks * block_size * kv_bytes_per_token(text_config, dtype)


def kv_cache_request(
    kv_cache_gb: float | str, *, sequences: int, max_tokens: int, prompt_lengths: Iterable[int], periodic_eval: bool = False
) -> dict[str, Any]:
    """``rollout.kv_cache_gb`` as the engines take it: a size (``kv_cache_gb``), or for ``auto`` what
    one generation call holds (``kv_cache_need``: ``sequences`` of the longest of ``prompt_lengths``
    + ``max_tokens``); with ``periodic_eval``, ``auto`` is the former fixed 1 GiB, so evaluation
    batches (not sized here) do not queue."""
    if kv_cache_gb != "auto":
        return {"kv_cache_gb": kv_cache_gb}
    if periodic_eval:
        return {"kv_cache_gb": AUTO_KV_CACHE_GB_WITH_EVAL}
    return {"kv_cache_need": KvCacheNeed(sequences=sequences, tokens_per_sequence=max(prompt_lengths, default=0) + max_tokens)}


def prompt_lengths(samples: Iterable[Any], tokenizer: Any, *, takes_images: bool, max_model_len: int) -> list[int]:
    """Each prompt's length in ids as an engine sends it (a chat prompt's own ids, else the text
    without added special tokens); an image prompt counts ``max_model_len`` (vLLM expands its images)."""
    if takes_images:
        return [max_model_len]
    samples = list(samples)
    texts = [s.prompt for s in samples if s.prompt_ids is None]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    return [len(s.prompt_ids) for s in samples if s.prompt_ids is not None] + [len(ids) for ids in encoded]
