"""The CUDA paths, on a tiny random policy: the device module's answers, the HF and vLLM engines
generating on the GPU and taking a weight sync through their in-process transport (checked by the
sampler/learner log-prob gap against a CUDA model holding the synced weights), the learner's
step on CUDA in fp32 and under bf16 autocast with fp32 master weights, and the CUDA random state
a checkpoint saves and restores.

Skipped without a GPU (tests/gpu/conftest.py); ``make test-gpu`` runs them. Written on a machine
without a GPU: they had not run when they were committed (see docs/testing.md).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.engines.base import build_rollout_engine
from polyrl.engines.weight_transport import InProcessReload
from polyrl.runtime import devices
from polyrl.runtime.precision import autocast
from polyrl.trainer.checkpoint import restore_rng_state, rng_state
from tests.training.learner_helpers import built, changed_fraction, snapshot

PROMPTS = [PromptSample(prompt=p) for p in ("12+7=", "hello", "(3*4)-5=")]
SETTINGS = SamplingSettings(n=4, temperature=1.0, max_tokens=16, seed=7)


def cuda_model(model_dir, seed: int | None = None) -> torch.nn.Module:
    """The policy in fp32 on the current CUDA device; with ``seed``, its weights perturbed."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model.to(devices.current_cuda_device()).eval()


def synced_and_checked(engine, model_dir) -> None:
    """Weights perturbed on the GPU go to ``engine`` as version 3; its samples carry 3 and score
    within 1e-3 nats a token under a CUDA model holding those weights (a stale sync: nats)."""
    assert isinstance(engine.transport, InProcessReload)
    reference = cuda_model(model_dir, seed=1)
    assert engine.update_weights(((n, t.detach()) for n, t in reference.state_dict().items()), version=3) == 3
    completions = [c for group in engine.generate(PROMPTS, SETTINGS) for c in group]
    assert {c.policy_version for c in completions} == {3}
    assert engine.verify_sync(reference, PROMPTS, SETTINGS) < 1e-3


def test_the_device_module_sees_the_gpu():
    assert devices.has_cuda() and devices.device_count() >= 1
    device = devices.current_cuda_device()
    assert device.type == "cuda" and devices.auto_device_name() == "cuda"
    assert devices.learner_device("auto") == device and devices.learner_device("cuda") == device
    assert devices.resolve_device_name("auto") == "cuda"
    states = devices.cuda_rng_states()
    assert len(states) == devices.device_count()
    first = torch.rand(4, device=device)
    devices.set_cuda_rng_states(states)
    assert torch.equal(torch.rand(4, device=device), first)  # the generator was put back
    devices.synchronize(device)


def test_a_checkpoints_random_state_includes_and_restores_the_gpus():
    device = devices.current_cuda_device()
    tensors, scalars = rng_state()
    assert "torch_cuda_0" in tensors
    first = torch.rand(4, device=device)
    restore_rng_state(tensors, scalars)
    assert torch.equal(torch.rand(4, device=device), first)


def test_the_hf_engine_generates_on_the_gpu_and_takes_a_sync(random_policy_dir):
    engine = build_rollout_engine("hf", str(random_policy_dir), seed=0)
    try:
        assert next(engine.model.parameters()).device.type == "cuda"
        synced_and_checked(engine, random_policy_dir)
    finally:
        engine.close()


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_generates_on_the_gpu_and_takes_a_sync(random_policy_dir):
    engine = build_rollout_engine("vllm", str(random_policy_dir), seed=0, kv_cache_gb=0.25, max_model_len=128)
    try:
        assert engine.release_weights() == 0  # nothing is released on CUDA (vllm_release.py is the CPU's)
        synced_and_checked(engine, random_policy_dir)
    finally:
        engine.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_learner_takes_a_step_on_the_gpu(tmp_path, tiny_experiment, dtype):
    """fp32, and bf16 compute: autocast on CUDA, the master weights and AdamW's moments fp32."""
    config = tiny_experiment(model={"dtype": dtype}, train={"steps": 1, "device": "cuda"})
    with built(tmp_path, config) as arm:
        policy = arm.learner.policy
        assert {p.device.type for p in policy.parameters()} == {"cuda"}
        assert {p.dtype for p in policy.parameters()} == {torch.float32}
        before = snapshot(policy)
        metrics = arm.loop(printer=lambda _line: None).step()
        assert torch.isfinite(torch.tensor(metrics["actor/loss"]))
        assert changed_fraction(before, policy) > 0.5
        moments = [s["exp_avg"] for s in arm.learner.optimizer.state.values() if "exp_avg" in s]
        assert moments and {m.dtype for m in moments} == {torch.float32} and {m.device.type for m in moments} == {"cuda"}


def test_bf16_autocast_on_the_gpu_computes_in_bf16_from_fp32_weights(random_policy_dir):
    model = cuda_model(random_policy_dir)
    ids = torch.tensor([[1, 2, 3, 4]], device=devices.current_cuda_device())
    with torch.no_grad(), autocast(model, torch.bfloat16):
        logits = model(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.float32
    with torch.no_grad():
        exact = model(input_ids=ids).logits
    # bf16 keeps 8 significant bits: a relative rounding of 2^-8 per operation; the tiny model's
    # logits (|x| < ~1) then differ from fp32's by a few hundredths, not by whole units.
    assert (logits.float() - exact).abs().max() < 0.1
