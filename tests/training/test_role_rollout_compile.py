"""``rollout.compile``: the arm's vLLM engine runs compiled, every step's weight sync reaches the
compiled model (the sampler/learner gap stays at fp32 rounding while the learner moves fast), and
the setting is refused where it would do nothing or is untested."""

from __future__ import annotations

import math
import shutil

import pytest

from polyrl.config.schema import ConfigError, resolve_arms
from polyrl.runtime.compiled import CompileError, check_sampler_compile
from tests.training.learner_helpers import built, changed_fraction, snapshot

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm]


def test_rollout_compile_is_refused_for_the_hf_engine():
    assert resolve_arms({"name": "x"})["main"].rollout.compile is False
    with pytest.raises(ConfigError) as refused:
        resolve_arms({"name": "x", "rollout": {"engine": "hf", "compile": True}})
    message = str(refused.value)
    assert "rollout.compile" in message and "engine: vllm" in message and "'hf'" in message


def test_rollout_compile_is_refused_for_image_text_policies():
    with pytest.raises(CompileError, match="rollout.compile: supported for text policies only"):
        check_sampler_compile(takes_images=True)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="vLLM's compiled sampler on CPU needs g++")
def test_compiled_vllm_sampler_takes_every_sync_and_trains(tmp_path, tiny_experiment):
    pytest.importorskip("vllm")
    config = tiny_experiment(
        rollout={"engine": "vllm", "max_tokens": 24, "compile": True},
        train={"steps": 3, "learning_rate": 1e-2, "micro_batch_size": 16},
    )
    with built(tmp_path, config) as arm:
        assert arm.collector.engine.compiled
        loop = arm.loop(printer=lambda _line: None)
        before = snapshot(arm.learner.policy)
        history = [loop.step() for _ in range(3)]
    assert changed_fraction(before, arm.learner.policy) > 0.5 and all(math.isfinite(h["actor/loss"]) for h in history)
    # lr 1e-2 moves the policy by nats per step: a compiled graph that kept the start-up weights
    # would show that here from step 2 on; an fp32 sampler in sync differs by rounding only.
    gaps = [h["rollout/logprob_gap"] for h in history]
    assert max(gaps) < 1e-3, gaps
