"""``train.padding_free``: rows packed end to end give the padded path's log-probs, entropy and
gradients, attention never crosses rows (these comparisons fail by whole nats if it does), and the
setting is refused where it cannot apply."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from polyrl.algos.objectives import get_objective
from polyrl.config.schema import ConfigError, resolve_arms
from polyrl.core.types import Completion
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.modeling.gradient_checkpointing import checkpoint_layers
from polyrl.modeling.logprobs import pack_completions, token_logprobs
from polyrl.modeling.microbatches import token_budget_micro_batches
from polyrl.modeling.packing import (
    PaddingFreeError,
    padding_free_refusal,
    resolve_padding_free,
    row_layout,
    use_packed_rows_attention,
)
from polyrl.modeling.probes import shortcut_refusal
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm
from polyrl.rollout.batches import LearnerBatch

VOCAB = 64
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def _completions(rows: list[tuple[list[int], list[int]]]) -> list[Completion]:
    return [
        Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-2.0] * len(c), finish_reason="length")
        for p, c in rows
    ]


def _rows_of_very_different_lengths(seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(prompt, completion) lengths from 1 to 61 tokens in all, an empty completion among them."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [(3, 0), (2, 40), (30, 1), (5, 5), (1, 60), (17, 3), (1, 1)]
    return [
        (torch.randint(5, VOCAB, (p,), generator=generator).tolist(), torch.randint(5, VOCAB, (c,), generator=generator).tolist())
        for p, c in lengths
    ]


def _qwen3():
    return build_tiny_causal_lm(build_char_tokenizer(), "0.3m", seed=1)


def _llama():
    torch.manual_seed(2)
    return LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=True))


def _qwen2_sliding():
    # A sliding window of 8 on every layer, shorter than most rows: the per-row attention must apply it too.
    torch.manual_seed(3)
    return Qwen2ForCausalLM(Qwen2Config(**TINY, use_sliding_window=True, sliding_window=8, max_window_layers=0))


def _logprobs_entropy_grads(policy, packed, padding_free: bool):
    policy.zero_grad()
    logprobs, entropy = token_logprobs(policy, packed, compute_entropy=True, padding_free=padding_free)
    (logprobs.sum() + entropy.sum()).backward()
    return logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


def test_rows_are_laid_end_to_end_with_their_own_positions():
    input_ids = torch.tensor([[5, 6, 7], [8, 0, 0], [9, 10, 0]])
    layout = row_layout(input_ids, (input_ids != 0).long())
    assert layout.input_ids.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 0, 0, 1]]
    # Row r's position p in the packed sequence; padding slots point at the row's first token.
    assert layout.row_slots.tolist() == [[0, 1, 2], [3, 3, 3], [4, 5, 4]]
    # Each packed token's place in the padded [3 rows × 3] layout: row × 3 + position.
    assert layout.token_slots.tolist() == [0, 1, 2, 3, 6, 7]


@pytest.mark.parametrize("build", [_qwen3, _llama, _qwen2_sliding], ids=["qwen3", "llama-tied", "qwen2-sliding-window"])
def test_packed_forward_gives_the_padded_logprobs_entropy_and_gradients(build):
    policy = build()
    packed = pack_completions(_completions(_rows_of_very_different_lengths()), pad_token_id=0)
    (lp, ent, grads), (lp_packed, ent_packed, grads_packed) = (
        _logprobs_entropy_grads(policy, packed, mode) for mode in (False, True)
    )
    assert policy.config._attn_implementation == "sdpa+packed_rows"
    assert torch.allclose(lp_packed, lp, atol=1e-5, rtol=0), float((lp_packed - lp).abs().max())
    assert torch.allclose(ent_packed, ent, atol=1e-5, rtol=0), float((ent_packed - ent).abs().max())
    for name, grad in grads.items():
        assert torch.allclose(grads_packed[name], grad, atol=1e-5, rtol=1e-4), name
    # The padded path still gives the same after the switch (the wrapper delegates to sdpa and its mask).
    assert torch.equal(token_logprobs(policy, packed)[0], lp)


def test_attention_that_crosses_rows_is_caught_by_the_comparison():
    """The comparison above has the power to see a leak: transformers' own packed-sequence
    detection is skipped as soon as a 2-D mask is passed, and the rows then see each other."""
    policy = _qwen3()
    packed = pack_completions(_completions(_rows_of_very_different_lengths()), pad_token_id=0)
    layout = row_layout(packed.input_ids, packed.attention_mask)
    decoder = policy.get_decoder()
    with torch.no_grad():
        own_rows = decoder(input_ids=packed.input_ids, attention_mask=packed.attention_mask, use_cache=False).last_hidden_state
        leaked = decoder(
            input_ids=layout.input_ids,
            position_ids=layout.position_ids,
            attention_mask=torch.ones_like(layout.input_ids),
            use_cache=False,
        ).last_hidden_state[0]
    assert (leaked - own_rows[packed.attention_mask.bool()]).abs().max() > 0.1


def test_gradient_checkpointing_recomputes_per_row_attention():
    """Under train.gradient_checkpointing the backward recomputes each layer's attention; the row
    layout travels with the layer's saved keyword arguments, so the recomputation stays per row."""
    policy = _llama()
    packed = pack_completions(_completions(_rows_of_very_different_lengths(1)), pad_token_id=0)
    _, _, grads = _logprobs_entropy_grads(policy, packed, False)
    recomputed = []
    assert checkpoint_layers(policy) == 2
    for layer in policy.get_decoder().layers:
        layer.self_attn.register_forward_hook(lambda *_: recomputed.append(torch.is_grad_enabled()))
    _, _, grads_packed = _logprobs_entropy_grads(policy, packed, True)
    assert recomputed.count(True) == 2 * 2  # each layer's attention ran in the forward and again in the backward
    for name, grad in grads.items():
        assert torch.allclose(grads_packed[name], grad, atol=1e-5, rtol=1e-4), name


def test_a_layer_that_drops_the_row_layout_is_refused():
    policy = _qwen3()
    layer = policy.get_decoder().layers[1]
    forward = layer.forward
    layer.forward = lambda *args, **kwargs: forward(*args, **{k: v for k, v in kwargs.items() if k != "polyrl_rows"})
    packed = pack_completions(_completions(_rows_of_very_different_lengths()), pad_token_id=0)
    with pytest.raises(PaddingFreeError, match="1 of 2 layers"):
        token_logprobs(policy, packed, padding_free=True)


def test_learner_update_is_the_same_padding_free():
    rows = _rows_of_very_different_lengths(2)
    packed = pack_completions(_completions(rows), pad_token_id=0)
    batch = LearnerBatch(
        packed=packed, old_logprobs=None, advantages=torch.linspace(-1, 1, len(rows))[:, None] * packed.response_mask
    )
    objective = get_objective("dr_grpo")
    policy = _qwen3()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    metrics, gradients, shapes = [], [], []
    for padding_free in (False, True):
        model = copy.deepcopy(policy)
        learner = PolicyLearner(
            model,
            objective,
            LearnerSettings(
                aggregation=objective.default_aggregation,
                learning_rate=1e-2,
                micro_batch_size=4,
                max_tokens=60,
                padding_free=padding_free,
            ),
        )
        step = learner.optimizer.step

        def captured_step(*args, step=step, model=model, **kwargs):
            gradients.append({n: p.grad.clone() for n, p in model.named_parameters()})  # before AdamW's m/√v
            return step(*args, **kwargs)

        learner.optimizer.step = captured_step
        assert shortcut_refusal(model) is None  # set-up's probe, before the forwards counted here
        model.get_decoder().register_forward_pre_hook(
            lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
        )
        metrics.append(learner.update(batch))
        assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())  # it trained
    # Rows longest first in micro-batches of 4: lengths 61, 42, 31, 20 | 10, 3, 2. Padded: 4 × 61
    # and 3 × 10 positions; packed: one row of 61 + 42 + 31 + 20 = 154, then 10 + 3 + 2 = 15.
    assert shapes == [(4, 61), (3, 10), (1, 154), (1, 15)]
    assert math.isfinite(metrics[1]["actor/loss"])
    assert metrics[1]["actor/loss"] == pytest.approx(metrics[0]["actor/loss"], abs=1e-6)
    assert metrics[1]["rollout/logprob_gap"] == pytest.approx(metrics[0]["rollout/logprob_gap"], abs=1e-5)
    for name in before:
        assert torch.allclose(gradients[1][name], gradients[0][name], atol=1e-6, rtol=1e-4), name


def test_token_budget_counts_real_tokens_when_padding_free():
    lengths = torch.tensor([10, 9, 4, 3, 2])
    # Padded: 10, 10 + 10 = 20 > 12 → [0]; [1] alone (9 + 9 = 18 > 12); 4, 8, 12 → [2, 3, 4].
    assert [b.tolist() for b in token_budget_micro_batches(torch.arange(5), lengths, 8, 12)] == [[0], [1], [2, 3, 4]]
    # Padding-free: 10 (+9 > 12) → [0]; 9 + 4 = 13 > 12 → [1]; 4 + 3 + 2 = 9 → [2, 3, 4]; with a budget of 14, 9 + 4 fits.
    assert [b.tolist() for b in token_budget_micro_batches(torch.arange(5), lengths, 8, 12, padded=False)] == [
        [0],
        [1],
        [2, 3, 4],
    ]
    assert [b.tolist() for b in token_budget_micro_batches(torch.arange(5), lengths, 8, 14, padded=False)] == [
        [0],
        [1, 2],
        [3, 4],
    ]


def test_refused_where_it_cannot_apply(random_policy_dir):
    policy = _qwen3()
    assert padding_free_refusal(policy) is None
    assert "image-text" in padding_free_refusal(policy, takes_images=True)
    assert resolve_padding_free("auto", policy, takes_images=False, share_prompts=False, compile=False).enabled is True
    assert resolve_padding_free("auto", policy, takes_images=False, share_prompts=True, compile=False).enabled is False
    assert resolve_padding_free(False, policy, takes_images=False, share_prompts=False, compile=False).enabled is False
    eager = _qwen3()
    eager.config._attn_implementation = "eager"
    assert "sdpa" in padding_free_refusal(eager)
    assert resolve_padding_free("auto", eager, takes_images=False, share_prompts=False, compile=False) == (
        False,
        "needs sdpa attention (one of sdpa, sdpa_fp32_on_cpu); this policy uses 'eager'",
    )
    with pytest.raises(PaddingFreeError, match=r"train\.padding_free: needs sdpa"):
        resolve_padding_free(True, eager, takes_images=False, share_prompts=False, compile=False)
    with pytest.raises(PaddingFreeError, match=r"train\.padding_free"):
        use_packed_rows_attention(eager)
    packed = pack_completions(_completions(_rows_of_very_different_lengths()), pad_token_id=0)
    packed.image_inputs = [{"pixel_values": torch.zeros(1, 1, 3, 4, 4)}] + [None] * (len(packed) - 1)
    with pytest.raises(ValueError, match="text-only"):
        token_logprobs(policy, packed, padding_free=True)
    for clash in ({"share_prompts": True}, {"compile": True}):
        config = {
            "name": "x",
            "model": {"path": str(random_policy_dir)},
            "objective": {"name": "dr_grpo"},
            "rewards": [{"module": "length"}],
            "train": {"padding_free": True, **clash},
        }
        with pytest.raises(ConfigError, match=r"train\.padding_free"):
            resolve_arms(config)


ARCHITECTURES = ["llama", "qwen2", "qwen3", "mistral", "gemma3_text", "gemma2", "phi3", "falcon_h1", "lfm2"]


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_every_tiny_architecture_packs_exactly_or_is_refused(model_type, tiny_arch_dir):
    """Through transformers' own model classes (loaded as a user's folder would be, sdpa): Gemma 3's
    alternating sliding-window layers (window 16, rows up to 61 tokens) and Phi-3's fused
    projections pack exactly; Gemma 2's soft-capped attention and logits are refused, and so are
    the hybrids (Falcon-H1: a logit multiplier, and Mamba beside attention; LFM2: convolution
    layers; tests/modeling/test_probes.py)."""
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(str(tiny_arch_dir(model_type)), dtype=torch.float32).eval()
    refusal = padding_free_refusal(policy)
    refused = {"gemma2": "attn_logit_softcapping", "falcon_h1": "after its output head", "lfm2": "1 of 2 layers"}
    if model_type in refused:
        assert refused[model_type] in refusal, refusal
        choice = resolve_padding_free("auto", policy, takes_images=False, share_prompts=False, compile=False)
        assert choice == (False, refusal)
        return
    assert refusal is None
    packed = pack_completions(_completions(_rows_of_very_different_lengths(3)), pad_token_id=0)
    (lp, ent, grads), (lp_packed, ent_packed, grads_packed) = (
        _logprobs_entropy_grads(policy, packed, mode) for mode in (False, True)
    )
    assert torch.allclose(lp_packed, lp, atol=1e-5, rtol=0), float((lp_packed - lp).abs().max())
    assert torch.allclose(ent_packed, ent, atol=1e-5, rtol=0), float((ent_packed - ent).abs().max())
    for name, grad in grads.items():
        assert torch.allclose(grads_packed[name], grad, atol=1e-5, rtol=1e-4), name


def test_lora_policy_packs_exactly():
    """model.lora: PEFT's LoRA layers inside the decoder see packed rows like any Linear."""
    from polyrl.modeling.lora import add_lora

    lora = add_lora(_qwen3(), r=4, alpha=8, target_modules="all-linear")
    for parameter in lora.trainable_parameters():
        torch.nn.init.normal_(parameter, std=0.05)  # B starts at zero; make the adapters matter
    policy = lora.model
    packed = pack_completions(_completions(_rows_of_very_different_lengths(4)), pad_token_id=0)
    (lp, _, grads), (lp_packed, _, grads_packed) = (_logprobs_entropy_grads(policy, packed, mode) for mode in (False, True))
    assert torch.allclose(lp_packed, lp, atol=1e-5, rtol=0), float((lp_packed - lp).abs().max())
    trained = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trained and all(torch.allclose(grads_packed[n], grads[n], atol=1e-5, rtol=1e-4) for n in trained)
