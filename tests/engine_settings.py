"""Rollout settings a test writes for the engine it runs, shared so the rule lives in one place."""

from __future__ import annotations

# A small vLLM KV cache: vLLM's default sizes it from the machine's memory, far more than a tiny
# policy needs, and several engines share the test machine.
TEST_KV_CACHE_GB = 0.25


def kv_cache_for(engine: str) -> dict[str, float]:
    """``rollout`` keys for ``engine``: a small KV cache on vLLM; nothing on the HF engine, which
    sizes no cache and refuses the setting."""
    return {"kv_cache_gb": TEST_KV_CACHE_GB} if engine == "vllm" else {}
