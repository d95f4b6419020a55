"""A parameter the reload misses after the engine released its weights is an error, not zeros.

``release_weights`` frees every parameter's memory and gives it back zeroed just before the
reload, which copies into it; a layer none of whose tensors come in the sync would sample with
zeros. Before this test the sync filter only warned (``polyrl.weight_sync``) and counted it in a
counter nobody read."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from rollout_models import PROMPTS, SETTINGS  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from polyrl.engines.base import build_rollout_engine  # noqa: E402
from polyrl.engines.kv_cache import KvCacheNeed  # noqa: E402
from polyrl.policies.text import build_random_text_model_dir  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(torch.cuda.is_available(), reason="the release applies to vLLM on the CPU only"),
]


def test_a_layer_missed_after_a_release_is_an_error_naming_it(tmp_path):
    directory = build_random_text_model_dir(tmp_path / "model", "3m", seed=0)
    engine = build_rollout_engine(
        "vllm", str(directory), seed=0, max_model_len=128, kv_cache_need=KvCacheNeed(sequences=16, tokens_per_sequence=40)
    )
    try:
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
        assert engine.release_weights() > 0
        # The final norm's only tensor left out of the sync: its released memory came back zeroed and stays so.
        weights = [(name, t) for name, t in model.state_dict().items() if name != "model.norm.weight"]
        with pytest.raises(RuntimeError, match=r"weight sync: .*RMSNorm.*hold zeros"):
            engine.sync_weights(weights)
        # A whole sync afterwards brings the engine back, exact.
        engine.sync_weights(model.state_dict().items())
        assert engine.verify_sync(model, PROMPTS) < 1e-5
        assert len(engine.generate(PROMPTS[:1], SETTINGS)) > 0
    finally:
        engine.close()
