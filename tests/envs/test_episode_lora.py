"""``env:`` with ``model.lora``: episodes train the adapter alone, and the engine samples every
turn with the adapted policy (merged weights on HF and vLLM; the adapter itself on vLLM)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.envs.shaped_guess import episode_experiment, observation_grad_is_zero, train_recording


def _check_lora_episodes(tmp_path, model_dir, engine: str, sync: str, gap: float):
    from polyrl.modeling.logprobs import logprob_gap, pack_completions, token_logprobs

    config = episode_experiment(
        tmp_path,
        model_dir,
        engine,
        model={"lora": {"r": 4, "alpha": 8, "target_modules": "all-linear", "sync": sync}},
    )
    arm, history, played, base, adapter = train_recording(config, tmp_path / "runs" / "main")
    policy = arm.learner.policy
    assert len(history) == 2 and all(math.isfinite(h["actor/loss"]) for h in history)
    assert history[0]["episode/observation_tokens_mean"] > 0 and history[0]["episode/turns_mean"] > 1.0
    # Only the adapter trains: the base weights are bit-equal, the adapter moved.
    assert base and all(torch.equal(base[n], p) for n, p in policy.named_parameters() if not p.requires_grad)
    assert any(not torch.equal(adapter[n], p) for n, p in policy.named_parameters() if p.requires_grad)
    # Step 2's episodes were sampled after update 1's sync: the learner's first forward (version 1,
    # the adapter moved) scores them as the sampler did, on the policy tokens of every turn.
    assert history[1]["rollout/policy_version"] == 1.0
    assert history[1]["rollout/logprob_gap"] < gap
    # ... which an engine left at the base weights would not: the base model scores them
    # differently (the final policy is version 2, so the base is compared with the sampler, which
    # needs no snapshot of version 1).
    packed = pack_completions(played[1], pad_token_id=0)
    with torch.no_grad(), arm.learner.lora.adapter_disabled():
        base_logprobs, _ = token_logprobs(policy, packed)
    assert logprob_gap(packed.sampling_logprobs, base_logprobs, packed.response_mask.bool()) > 10 * gap
    # Observation tokens stay out of the gradient through the adapted policy.
    assert observation_grad_is_zero(policy, played[1])


@pytest.mark.slow
def test_lora_episodes_train_the_adapter_through_hf(tmp_path, tiny_arch_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _check_lora_episodes(tmp_path, tiny_arch_dir("qwen2"), "hf", "merged", 1e-4)


# On vLLM only the adapter sync: a merged sync reaches vLLM as a plain weight sync, the path every
# vLLM episode test takes; the adapter is sent with each turn's generation call instead.
# In a process of its own: run alone it passes, but once, in a full `make test` on a fresh clone,
# it found the sampler's log-probs equal to the base model's at step 2 (1.7e-7 apart) after other
# tests had run in the same worker; that is not understood yet (docs/episodes.md), and a test
# whose outcome depends on its neighbours proves nothing either way.
@pytest.mark.slow
@pytest.mark.vllm
def test_lora_episodes_train_the_adapter_through_vllm_with_adapter_sync(tmp_path, tiny_arch_dir):
    import subprocess
    import sys
    from pathlib import Path

    from run_control import child_env

    root = Path(__file__).resolve().parents[2]
    code = (
        "import os, pathlib, sys; sys.path[:0] = [sys.argv[3], sys.argv[3] + '/tests']; os.chdir(sys.argv[1]); "
        "from tests.envs.test_episode_lora import _check_lora_episodes; "
        "_check_lora_episodes(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), 'vllm', 'adapter', 1e-3)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), str(tiny_arch_dir("qwen2")), str(root)],
        cwd=root,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
