"""Set-up probes (polyrl.modeling.probes): the decoder → head shortcut, rows packed end to end
(``train.padding_free``) and a prompt's completions in one row (``train.share_prompts``) are used
only where they give the model's own log-probs. Hybrids whose layers mix tokens outside
attention (Falcon-H1: Mamba beside attention; LFM2: convolution layers) fall back under ``auto``
with the reason and are refused under ``true``; a logit multiplier after the head sends the
learner through the model's own forward."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from polyrl.core.types import Completion
from polyrl.modeling import probes
from polyrl.modeling.logprobs import pack_completions, token_logprobs
from polyrl.modeling.packing import PaddingFree, PaddingFreeError, padding_free_refusal, resolve_padding_free
from polyrl.modeling.shared_prompts import sharing_refusal
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm


def _load(folder, **overrides) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **overrides)


def _rows(seed: int = 0) -> list[Completion]:
    generator = torch.Generator().manual_seed(seed)
    lengths = [(5, 7), (3, 2), (9, 4)]
    return [
        Completion(
            prompt_ids=torch.randint(5, 400, (p,), generator=generator).tolist(),
            completion_ids=torch.randint(5, 400, (c,), generator=generator).tolist(),
            text="",
            sampling_logprobs=[],
            finish_reason="length",
        )
        for p, c in lengths
    ]


def _own_forward_logprobs(model, completions: list[Completion]) -> list[torch.Tensor]:
    """Each row alone through ``model(ids).logits``: log_softmax at the completion's positions, gathered."""
    out = []
    with torch.no_grad():
        for c in completions:
            logits = model(input_ids=torch.tensor([c.prompt_ids + c.completion_ids])).logits[0]
            n = len(c.prompt_ids)
            logp = torch.log_softmax(logits[n - 1 : n - 1 + len(c.completion_ids)].float(), dim=-1)
            out.append(logp.gather(-1, torch.tensor(c.completion_ids)[:, None])[:, 0])
    return out


def _resolve(setting, model) -> PaddingFree:
    return resolve_padding_free(setting, model, takes_images=False, share_prompts=False, compile=False)


def test_a_logit_multiplier_sends_the_learner_through_the_models_own_forward(tiny_arch_dir):
    """Falcon-H1 multiplies its logits by lm_head_multiplier (0.5 here) after the head. Before the
    probe, the shortcut's log-probs ignored it (a list of four other names was checked); now the
    probe rejects the shortcut and the learner's log-probs are the model's own."""
    model = _load(tiny_arch_dir("falcon_h1")).eval()
    refusal = probes.shortcut_refusal(model)
    assert refusal is not None and "after its output head" in refusal
    completions = _rows()
    batch = pack_completions(completions, pad_token_id=0)
    with torch.no_grad():
        learner, _ = token_logprobs(model, batch)
    own = _own_forward_logprobs(model, completions)
    for row, expected in enumerate(own):
        assert torch.allclose(learner[row, : len(expected)], expected, atol=1e-5, rtol=0), row
    # The shortcut would have been far off: the head's logits without the 0.5.
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        unscaled = torch.log_softmax(model.get_output_embeddings()(hidden[0, 4:11]), dim=-1)
        unscaled = unscaled.gather(-1, torch.tensor(completions[0].completion_ids)[:, None])[:, 0]
    assert (unscaled - own[0]).abs().max() > 1e-2
    # The same model with the multiplier at 1 takes the shortcut again.
    assert probes.shortcut_refusal(_load(tiny_arch_dir("falcon_h1"), lm_head_multiplier=1.0)) is None


def test_a_soft_cap_after_the_head_is_caught_even_where_random_logits_are_small(tiny_arch_dir):
    """Gemma 2 soft-caps its final logits (30·tanh(x/30)); a random model's logits are ~1, where the
    cap is nearly the identity. The probe magnifies the head's output, so the cap shows."""
    refusal = probes.shortcut_refusal(_load(tiny_arch_dir("gemma2")))
    assert refusal is not None and "magnified" in refusal


def test_mamba_beside_attention_leaks_between_packed_rows_so_auto_falls_back(tiny_arch_dir):
    """Falcon-H1 with its multiplier at 1 (the shortcut applies): its Mamba mixer runs along the
    whole packed sequence, so changing row 0 moves row 1. Before the probe, padding_free_refusal
    said None and auto packed it."""
    model = _load(tiny_arch_dir("falcon_h1"), lm_head_multiplier=1.0)
    assert probes.shortcut_refusal(model) is None
    choice = _resolve("auto", model)
    assert choice.enabled is False
    assert "changing one row moves the other's log-probs" in choice.reason, choice.reason
    assert padding_free_refusal(model) == choice.reason
    with pytest.raises(PaddingFreeError, match=r"train\.padding_free: .*changing one row moves .*; set it to false or auto"):
        _resolve(True, model)
    assert _resolve(False, model) == PaddingFree(False, None)
    # A prompt's completions in one row leak the same way: train.share_prompts is refused.
    sharing = sharing_refusal(model, takes_images=False)
    assert sharing is not None and "changing one row moves" in sharing


def test_a_falcon_h1_that_packs_would_have_been_wrong(tiny_arch_dir):
    """What the probe saves the learner from: the packed log-probs of row 1 differ from the row
    alone (the per-row attention count passes, so nothing else would have said so)."""
    from polyrl.modeling.packing import packed_response_hidden

    model = _load(tiny_arch_dir("falcon_h1"), lm_head_multiplier=1.0).eval()
    completions = _rows(1)
    batch = pack_completions(completions, pad_token_id=0)
    with torch.no_grad():
        states = model.get_output_embeddings()(packed_response_hidden(model, batch))
        packed = torch.log_softmax(states, dim=-1).gather(-1, batch.completion_ids[..., None])[..., 0]
    own = _own_forward_logprobs(model, completions)
    assert (packed[1, : len(own[1])] - own[1]).abs().max() > 1e-4


def test_convolution_layers_fall_back_at_set_up_not_at_the_first_update(tiny_arch_dir):
    """LFM2: convolution layers between attention layers. Before the probe, auto packed it and the
    first update stopped with the per-row attention count; now set-up falls back and says why."""
    model = _load(tiny_arch_dir("lfm2"))
    choice = _resolve("auto", model)
    assert choice.enabled is False and "per-row attention in 1 of 2 layers" in choice.reason, choice.reason
    with pytest.raises(PaddingFreeError, match=r"train\.padding_free: Lfm2ForCausalLM: rows packed end to end raised"):
        _resolve(True, model)
    assert "changing one row moves" in sharing_refusal(model, takes_images=False)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "phi3", "gemma3_text"])
def test_attention_only_models_pass_every_probe(model_type, tiny_arch_dir):
    model = _load(tiny_arch_dir(model_type))
    assert probes.shortcut_refusal(model) is None
    assert _resolve("auto", model) == PaddingFree(True, None)
    assert sharing_refusal(model, takes_images=False) is None


def test_probes_are_deterministic_cached_and_leave_the_model_as_it_was(tiny_arch_dir, monkeypatch):
    model = _load(tiny_arch_dir("lfm2")).train()
    attention = model.config._attn_implementation
    first = padding_free_refusal(model)
    assert model.training and model.config._attn_implementation == attention  # the packed probe switched it back
    assert all(p.grad is None for p in model.parameters())
    assert padding_free_refusal(_load(tiny_arch_dir("lfm2"))) == first  # a fresh copy: the same verdict, word for word
    # A verdict is kept per model: asking again runs no probe.
    monkeypatch.setattr(probes, "_packing_probe", lambda model: pytest.fail("probed twice"))
    monkeypatch.setattr(probes, "_shortcut_probe", lambda model: pytest.fail("probed twice"))
    assert padding_free_refusal(model) == first


def test_a_shortcut_that_raises_is_a_verdict_against_it():
    model = build_tiny_causal_lm(build_char_tokenizer(), "0.3m", seed=0)

    def broken(*args, **kwargs):
        raise RuntimeError("no such kernel")

    model.get_decoder().forward = broken
    assert probes.shortcut_refusal(model) == "Qwen3ForCausalLM: decoder then output head raised RuntimeError: no such kernel"


def test_a_positional_mistake_that_does_not_leak_is_caught_by_the_agreement_check(monkeypatch):
    """A packed forward that puts every token at position 0 leaks nothing (a row's numbers do not
    depend on the other row's tokens) but loses the order within each row; the probe's agreement
    with each row alone catches it. (A constant shift of a row's positions would not be a
    mistake under rotary embeddings, which see relative positions only.)"""
    import polyrl.modeling.packing as packing

    model = build_tiny_causal_lm(build_char_tokenizer(), "0.3m", seed=0)
    layout = packing.row_layout

    def positions_lost(input_ids, attention_mask):
        out = layout(input_ids, attention_mask)
        out.position_ids = torch.zeros_like(out.position_ids)
        return out

    monkeypatch.setattr(packing, "row_layout", positions_lost)
    refusal = padding_free_refusal(model)
    assert refusal is not None and "other log-probs than each row alone" in refusal, refusal


@pytest.mark.parametrize("model_type", ["falcon_h1", "lfm2"])
def test_hybrids_train_with_packing_off(model_type, tiny_arch_dir):
    """Three learner updates of a hybrid as set-up leaves it (padding_free auto → off): the loss is
    finite, the gradient is not zero and every update moves the weights; the learner's log-probs
    are the model's own."""
    from polyrl.algos.objectives import get_objective
    from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
    from polyrl.rollout.batches import LearnerBatch

    model = _load(tiny_arch_dir(model_type))
    choice = _resolve("auto", model)
    assert choice.enabled is False and choice.reason
    completions = _rows(2)
    packed = pack_completions(completions, pad_token_id=0)
    with torch.no_grad():
        learner_logprobs, _ = token_logprobs(model, packed)
    for row, own in enumerate(_own_forward_logprobs(model, completions)):
        assert torch.allclose(learner_logprobs[row, : len(own)], own, atol=1e-5, rtol=0), row
    objective = get_objective("dr_grpo")
    learner = PolicyLearner(
        model,
        objective,
        LearnerSettings(
            aggregation=objective.default_aggregation,
            learning_rate=1e-2,
            micro_batch_size=2,
            max_tokens=8,
            padding_free=choice.enabled,
        ),
    )
    advantages = torch.tensor([1.0, -1.0, 0.5])[:, None] * packed.response_mask
    for _ in range(3):  # three on-policy steps: π_old is each step's own (as the pipeline recomputes it)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        with torch.no_grad():
            old, _ = token_logprobs(model, packed)
        metrics = learner.update(LearnerBatch(packed=packed, old_logprobs=old, advantages=advantages))
        assert torch.isfinite(torch.tensor(metrics["actor/loss"])), metrics
        assert metrics["actor/grad_norm"] > 0
        assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
