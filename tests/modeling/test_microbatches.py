"""Length-sorted micro-batches with padding trimmed: same loss and gradients, fewer positions."""

from __future__ import annotations

import torch

from polyrl.algos.aggregation import aggregate, global_loss_normalizer
from polyrl.core.types import Completion
from polyrl.modeling.logprobs import pack_completions, token_logprobs
from polyrl.modeling.microbatches import length_sorted_micro_batches, token_budget_micro_batches, trim_columns, trim_padding


def _completion(prompt: list[int], completion: list[int]) -> Completion:
    return Completion(
        prompt_ids=prompt, completion_ids=completion, text="", sampling_logprobs=[-1.0] * len(completion), finish_reason="stop"
    )


def test_trim_padding_keeps_the_longest_row_of_the_micro_batch():
    # Rows: prompt 2 + completion 1 (3 tokens), prompt 1 + completion 2 (3 tokens), and a long
    # row prompt 3 + completion 5 (8 tokens) that sets the batch width S = 8, T = 5.
    packed = pack_completions(
        [_completion([5, 6], [7]), _completion([5], [8, 9]), _completion([5, 6, 7], [1, 2, 3, 4, 9])], pad_token_id=0
    )
    assert packed.input_ids.shape == (3, 8) and packed.response_mask.shape == (3, 5)
    short = trim_padding(packed.select([0, 1]))
    # Longest real row of the two is 3 tokens; longest completion 2.
    assert short.input_ids.tolist() == [[5, 6, 7], [5, 8, 9]]
    assert short.attention_mask.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert short.response_mask.tolist() == [[1, 0], [1, 1]]
    assert short.completion_ids.tolist() == [[7, 0], [8, 9]]
    # Completion token t is predicted at position prompt_len - 1 + t; masked slots point at the last prompt position.
    assert short.response_index.tolist() == [[1, 1], [0, 1]]
    assert short.sampling_logprobs.tolist() == [[-1.0, 0.0], [-1.0, -1.0]]
    advantages, per_sequence = torch.ones(2, 5), torch.ones(2)
    cut, same = trim_columns(2, [advantages, per_sequence])
    assert cut.shape == (2, 2) and same is per_sequence


def test_length_sorted_micro_batches_group_similar_lengths():
    rows = torch.tensor([0, 1, 2, 3, 4])
    lengths = torch.tensor([3, 9, 3, 7, 1])
    parts = length_sorted_micro_batches(rows, lengths, 2)
    # Longest first: 9 (row 1), 7 (row 3), then the two 3s in their given order (rows 0, 2), then 1 (row 4).
    assert [p.tolist() for p in parts] == [[1, 3], [0, 2], [4]]


def test_sorted_trimmed_micro_batches_give_the_same_loss_and_gradients(random_policy_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float64).eval()
    generator = torch.Generator().manual_seed(0)
    completions = []
    for n_prompt, n_resp in [(4, 2), (3, 11), (5, 1), (2, 7), (6, 3), (3, 9)]:
        prompt = torch.randint(3, 60, (n_prompt,), generator=generator).tolist()
        completions.append(_completion(prompt, torch.randint(3, 60, (n_resp,), generator=generator).tolist()))
    packed = pack_completions(completions, pad_token_id=0)
    advantages = torch.randn(len(completions), packed.response_mask.shape[1], generator=generator, dtype=torch.float64)
    mask = packed.response_mask.bool()
    normalizer = global_loss_normalizer(mask, mode="seq_sum_constant_norm", max_response_length=16)

    def loss_and_grads(parts, trim):
        model.zero_grad()
        total = 0.0
        for rows in parts:
            micro = packed.select(rows)
            adv, micro_mask = advantages[rows], mask[rows]
            if trim:
                micro = trim_padding(micro)
                adv, micro_mask = trim_columns(micro.response_mask.shape[1], [adv, micro_mask])
            logprobs, _ = token_logprobs(model, micro)
            loss = aggregate(-adv * logprobs, micro_mask, mode="seq_sum_constant_norm", loss_normalizer=normalizer)
            loss.backward()
            total += float(loss.detach())
        return total, [p.grad.clone() for p in model.parameters()]

    rows = torch.arange(len(completions))
    plain_loss, plain_grads = loss_and_grads(list(torch.split(rows, 2)), trim=False)
    lengths = packed.attention_mask.sum(dim=1)
    sorted_loss, sorted_grads = loss_and_grads(length_sorted_micro_batches(rows, lengths, 2), trim=True)
    assert abs(plain_loss - sorted_loss) < 1e-12
    assert plain_loss != 0.0
    for a, b in zip(plain_grads, sorted_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    # And it computes fewer positions: 3 micro-batches × 2 rows × S=14 before; sorted and trimmed
    # the micro-batches hold rows of 14 and 12, 9 and 9, 6 and 6 tokens → 2 × (14 + 9 + 6) = 58 < 84.
    trimmed_positions = sum(
        trim_padding(packed.select(p)).input_ids.numel() for p in length_sorted_micro_batches(rows, lengths, 2)
    )
    assert packed.input_ids.shape[1] == 14 and trimmed_positions == 58


def test_token_budget_micro_batches_by_hand():
    lengths = torch.tensor([10, 30, 20, 5, 25])
    rows = torch.arange(5)
    # Longest first: 30 (row 1), 25 (4), 20 (2), 10 (0), 5 (3). Budget 60, at most 3 rows:
    # [1] width 30; + row 4: 2×30 = 60 ≤ 60; + row 2: 3×30 = 90 > 60 → new micro-batch, width 20;
    # + row 0: 2×20 = 40; + row 3: 3×20 = 60 ≤ 60 → [2, 0, 3].
    got = [b.tolist() for b in token_budget_micro_batches(rows, lengths, max_rows=3, max_tokens=60)]
    assert got == [[1, 4], [2, 0, 3]]
    # The row cap binds before the budget: 1-token rows, at most 2 per micro-batch.
    assert [b.tolist() for b in token_budget_micro_batches(torch.arange(4), torch.ones(4, dtype=torch.long), 2, 100)] == [
        [0, 1],
        [2, 3],
    ]
    # A row longer than the budget goes alone; the rest still share.
    assert [b.tolist() for b in token_budget_micro_batches(torch.tensor([0, 1, 2]), torch.tensor([100, 5, 5]), 8, 50)] == [
        [0],
        [1, 2],
    ]
    # Only the given rows (a mini-batch), each exactly once.
    picked = torch.tensor([4, 0, 3])
    assert sorted(sum((b.tolist() for b in token_budget_micro_batches(picked, lengths, 2, 30)), [])) == [0, 3, 4]
