"""train.gradient_checkpointing: decoder layers recompute their activations in the backward,
in the learner's eval mode (where transformers' own switch does nothing), with the same gradients."""

from __future__ import annotations

import pytest
import torch

from polyrl.core.types import Completion
from polyrl.modeling.gradient_checkpointing import GradientCheckpointingError, checkpoint_layers
from polyrl.modeling.logprobs import pack_completions, token_logprobs
from polyrl.modeling.probes import shortcut_refusal
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm


def _batch():
    rows = [([5, 6, 7], [8, 9, 10, 11]), ([12, 13], [14, 15, 16])]
    return pack_completions(
        [
            Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-1.0] * len(c), finish_reason="length")
            for p, c in rows
        ],
        pad_token_id=0,
    )


def _policy():
    return build_tiny_causal_lm(build_char_tokenizer(), "0.3m", seed=2).eval()


def _attention_calls(model):
    """Counts the attention modules' calls (a recomputed layer calls its attention again)."""
    calls = [0]
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _grads(model):
    model.zero_grad(set_to_none=True)
    logp, entropy = token_logprobs(model, _batch(), compute_entropy=True)
    (logp.sum() + 0.1 * entropy.sum()).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_checkpointed_policy_recomputes_layers_and_gets_the_same_gradients():
    plain, checkpointed = _policy(), _policy()
    assert checkpoint_layers(checkpointed) == 2  # the 0.3m policy's two decoder layers
    assert shortcut_refusal(plain) is None and shortcut_refusal(checkpointed) is None  # set-up's probe, before the count
    plain_calls, checkpointed_calls = _attention_calls(plain), _attention_calls(checkpointed)
    want, got = _grads(plain), _grads(checkpointed)
    assert plain_calls[0] == 2 and checkpointed_calls[0] == 4  # each layer ran again in the backward
    assert not checkpointed.training  # dropout stays off
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=0, rtol=0, msg=name)
    with torch.no_grad():  # no-grad passes (π_old, reference) run once, as before
        token_logprobs(checkpointed, _batch())
    assert checkpointed_calls[0] == 4 + 2  # two layers, once each


def test_checkpointed_critic_gets_the_same_gradients(random_policy_dir):
    from polyrl.learner.critic import ValueModel

    def value_grads(model):
        model.zero_grad(set_to_none=True)
        model(_batch()).sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    torch.manual_seed(0)
    plain = ValueModel(random_policy_dir, torch.float32).eval()
    checkpointed = ValueModel(random_policy_dir, torch.float32).eval()
    checkpointed.load_state_dict(plain.state_dict())
    assert checkpoint_layers(checkpointed, role="critic") == 2
    want, got = value_grads(plain), value_grads(checkpointed)
    assert want.keys() == got.keys() and len(want) > 5
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=0, rtol=0, msg=name)


def test_a_model_without_checkpointable_layers_is_refused():
    with pytest.raises(GradientCheckpointingError, match="train.gradient_checkpointing: the policy \\(Linear\\)"):
        checkpoint_layers(torch.nn.Linear(2, 2))


def test_gradient_checkpointing_with_lora_trains_the_adapter():
    """Frozen embeddings under LoRA: non-reentrant checkpointing still gives the adapter its gradients."""
    from polyrl.modeling.lora import add_lora

    plain = add_lora(_policy(), r=4, alpha=8, target_modules=["q_proj", "v_proj"]).model
    checkpointed = add_lora(_policy(), r=4, alpha=8, target_modules=["q_proj", "v_proj"]).model
    checkpoint_layers(checkpointed)
    with torch.no_grad():
        for model in (plain, checkpointed):
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.fill_(0.01)

    def adapter_grads(model):
        model.zero_grad(set_to_none=True)
        logp, _ = token_logprobs(model, _batch())
        logp.sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}

    want, got = adapter_grads(plain), adapter_grads(checkpointed)
    assert len(want) == 8 and all(g.abs().sum() > 0 for g in got.values())
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=0, rtol=0, msg=name)


def test_the_setting_reaches_policy_and_critic_and_refuses_compile(tmp_path, tiny_experiment):
    from polyrl.config.schema import resolve_arms
    from polyrl.trainer.build_arm import build_arm

    def build(**train):
        config = tiny_experiment(objective={"name": "ppo"}, train={"gradient_checkpointing": True, **train})
        return build_arm(resolve_arms(config)["main"], arm="main", arm_dir=tmp_path / "runs" / "main")

    arm = build()
    try:
        for model in (arm.learner.policy, arm.critic.model):
            layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
            assert layers and all(getattr(layer.forward, "polyrl_checkpointed", False) for layer in layers)
    finally:
        arm.close()
    with pytest.raises(GradientCheckpointingError, match="train.compile"):
        build(compile=True)
