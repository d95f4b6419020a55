"""``train.share_prompts``: one packed row per prompt gives the per-row log-probs and gradients,
the learner trains the same with and without it, and it is refused where it would not apply."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from polyrl.algos.objectives import get_objective
from polyrl.config.schema import ConfigError, resolve_arms
from polyrl.core.types import Completion
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.modeling.logprobs import pack_completions, token_logprobs
from polyrl.modeling.probes import shortcut_refusal
from polyrl.modeling.shared_prompts import row_prompts, share_prompts, shared_prompt_micro_batches, sharing_refusal
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm
from polyrl.rollout.batches import LearnerBatch


def _completions(rows: list[tuple[list[int], list[int]]]) -> list[Completion]:
    return [
        Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-2.0] * len(c), finish_reason="length")
        for p, c in rows
    ]


# Two completions of prompt A (one of them empty-free), one of prompt B, a second of A after it,
# and an empty completion of B: rows interleave the groups as a shuffled batch would.
A, B = [5, 6, 7], [11, 12]
ROWS = [(A, [8, 9]), (B, [13, 14, 15]), (A, [10]), (B, [])]


def test_rows_of_a_prompt_become_one_packed_row_with_their_own_positions_and_mask():
    packed = pack_completions(_completions(ROWS), pad_token_id=0)
    rows = share_prompts(packed.input_ids, packed.response_index, packed.response_mask, packed.completion_ids)
    # A | 8 9 | 10 → 6 positions; B | 13 14 15 | (empty) → 5, padded to 6.
    assert rows.input_ids.tolist() == [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 0]]
    # Each completion continues from its prompt's end: 10 sits at position 3, as in its own row.
    assert rows.position_ids.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 3, 4, 0]]
    allowed = rows.allowed.int().tolist()
    assert allowed[0][5] == [1, 1, 1, 0, 0, 1]  # token 10 sees the prompt and itself, not 8 9
    assert allowed[0][4] == [1, 1, 1, 1, 1, 0]  # token 9 sees the prompt, 8 and itself
    assert allowed[1][5] == [0, 0, 0, 0, 0, 1]  # padding attends to itself only (no empty softmax row)
    # Where each token's predicting hidden state is, as row × 6 + position: token 0 from the
    # prompt's last position, token t from the completion's token t - 1; masked slots → the prompt's last.
    assert rows.source.tolist() == [[2, 3, 2], [7, 8, 9], [2, 2, 2], [7, 7, 7]]
    assert rows.computed_positions == 12  # instead of 4 rows × 6 columns = 24


def test_long_completions_keep_rows_of_their_own_where_the_packed_attention_would_cost_more():
    prompt = [5, 6]
    long_rows = pack_completions(_completions([(prompt, list(range(20, 30))), (prompt, list(range(30, 40)))]), pad_token_id=0)
    short_rows = pack_completions(_completions([(prompt, [20]), (prompt, [30])]), pad_token_id=0)

    def packed_rows(batch, ratio):
        return share_prompts(
            batch.input_ids, batch.response_index, batch.response_mask, batch.completion_ids, attention_cost_ratio=ratio
        ).input_ids.shape[0]

    # Ratio 10, T = 10 after a row of 12: appending costs 10 + (2·12·10 + 10²)/10 = 44, a row of
    # its own 12 + 12²/10 = 26.4, so two rows. T = 1 after a row of 3: 1 + (2·3 + 1)/10 = 1.7
    # against 3 + 3²/10 = 3.9, so one. Without attention cost (ratio ∞) sharing always pays.
    assert packed_rows(long_rows, 10.0) == 2
    assert packed_rows(short_rows, 10.0) == 1
    assert packed_rows(long_rows, math.inf) == 1


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_shared_forward_gives_the_per_row_logprobs_entropy_and_gradients(attention):
    tokenizer = build_char_tokenizer()
    policy = build_tiny_causal_lm(tokenizer, "0.3m", seed=1)
    policy.config._attn_implementation = attention
    generator = torch.Generator().manual_seed(0)
    rows = []
    for group in range(3):
        prompt = torch.randint(5, 60, (3 + 4 * group,), generator=generator).tolist()
        rows += [(prompt, torch.randint(5, 60, (n,), generator=generator).tolist()) for n in (0, 1, 6, 11)]
    order = torch.randperm(len(rows), generator=generator).tolist()
    packed = pack_completions(_completions([rows[i] for i in order]), pad_token_id=0)
    results = []
    for share in (False, True):
        policy.zero_grad()
        logprobs, entropy = token_logprobs(policy, packed, compute_entropy=True, share_prompts=share)
        (logprobs.sum() + entropy.sum()).backward()
        results.append((logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in policy.named_parameters()}))
    (lp, ent, grads), (lp_shared, ent_shared, grads_shared) = results
    assert torch.allclose(lp_shared, lp, atol=1e-5, rtol=0), float((lp_shared - lp).abs().max())
    assert torch.allclose(ent_shared, ent, atol=1e-5, rtol=0)
    for name, grad in grads.items():
        assert torch.allclose(grads_shared[name], grad, atol=1e-5, rtol=1e-4), name


def test_micro_batches_are_whole_packs_longest_first():
    packed = pack_completions(_completions(ROWS), pad_token_id=0)
    prompts = row_prompts(packed.input_ids, packed.response_index)
    assert prompts == [tuple(A), tuple(B), tuple(A), tuple(B)]
    lengths = packed.response_mask.sum(dim=1).tolist()
    # Packs: A with rows 0, 2 (3 + 2 + 1 = 6 positions), B with rows 1, 3 (2 + 3 + 0 = 5).
    assert [b.tolist() for b in shared_prompt_micro_batches(torch.arange(4), prompts, lengths, size=2)] == [[0, 2], [1, 3]]
    assert [b.tolist() for b in shared_prompt_micro_batches(torch.arange(4), prompts, lengths, size=4)] == [[0, 2, 1, 3]]
    # A pack larger than the micro-batch is cut; the pieces still go longest first.
    assert [b.tolist() for b in shared_prompt_micro_batches(torch.tensor([3, 2, 1, 0]), prompts, lengths, size=1)] == [
        [2],
        [0],
        [3],
        [1],
    ]


def test_learner_update_is_the_same_with_shared_prompts():
    tokenizer = build_char_tokenizer()
    rows = [(A, [8, 9, 10, 11]), (B, [13]), (A, [9, 9]), (B, [14, 15, 16]), (A, [12, 8, 8, 8, 8]), (B, [17, 18])]
    packed = pack_completions(_completions(rows), pad_token_id=0)
    batch = LearnerBatch(
        packed=packed,
        old_logprobs=None,
        advantages=torch.tensor([1.0, -1.0, -0.5, 0.5, 0.25, -0.25])[:, None] * packed.response_mask,
    )
    objective = get_objective("dr_grpo")
    policy = build_tiny_causal_lm(tokenizer, "0.3m", seed=0)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    updated, metrics, gradients = [], [], []
    for share in (False, True):
        model = copy.deepcopy(policy)
        learner = PolicyLearner(
            model,
            objective,
            LearnerSettings(
                aggregation=objective.default_aggregation,
                learning_rate=1e-2,
                micro_batch_size=3,
                max_tokens=8,
                share_prompts=share,
            ),
        )
        step = learner.optimizer.step

        def captured_step(*args, step=step, model=model, **kwargs):
            # The accumulated gradient, before AdamW (whose m/√v turns a 1e-8 difference in a
            # near-zero gradient into a whole learning-rate step of difference).
            gradients.append({n: p.grad.clone() for n, p in model.named_parameters()})
            return step(*args, **kwargs)

        learner.optimizer.step = captured_step
        shapes = []
        assert shortcut_refusal(model) is None  # set-up's probe, before the forwards counted here
        model.get_decoder().register_forward_pre_hook(
            lambda _m, _a, kw, shapes=shapes: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
        )
        metrics.append(learner.update(batch))
        updated.append({n: p.detach().clone() for n, p in model.named_parameters()})
        if share:
            # Micro-batches of 3 rows = one prompt each: A | 4+2+5 tokens = 14, B | 1+3+2 = 8.
            assert shapes == [(1, 14), (1, 8)]
    assert math.isfinite(metrics[1]["actor/loss"])
    assert metrics[1]["actor/loss"] == pytest.approx(metrics[0]["actor/loss"], abs=1e-6)
    assert any(not torch.equal(before[n], updated[1][n]) for n in before)  # it trained
    assert len(gradients) == 2
    for name in before:
        assert torch.allclose(gradients[1][name], gradients[0][name], atol=1e-6, rtol=1e-4), name


def test_refused_where_it_would_not_apply(random_policy_dir):
    tokenizer = build_char_tokenizer()
    policy = build_tiny_causal_lm(tokenizer, "0.3m", seed=0)
    assert sharing_refusal(policy, takes_images=False) is None
    assert "image-text" in sharing_refusal(policy, takes_images=True)
    policy.config._attn_implementation = "flash_attention_2"
    assert "4-D mask" in sharing_refusal(policy, takes_images=False)
    with pytest.raises(ValueError, match="images"):
        packed = pack_completions(_completions(ROWS), pad_token_id=0)
        packed.image_inputs = [{"pixel_values": torch.zeros(1, 1, 3, 4, 4)}, None, None, None]
        token_logprobs(build_tiny_causal_lm(tokenizer, "0.3m", seed=0), packed, share_prompts=True)
    config = {
        "name": "x",
        "model": {"path": str(random_policy_dir)},
        "objective": {"name": "dr_grpo"},
        "rewards": [{"module": "length"}],
        "train": {"share_prompts": True, "micro_batch_tokens": 256},
    }
    with pytest.raises(ConfigError, match=r"train\.share_prompts"):
        resolve_arms(config)
