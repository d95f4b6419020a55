"""The learner forwards length-sorted micro-batches without their padding columns."""

from __future__ import annotations

import math

import torch

from polyrl.algos.objectives import get_objective
from polyrl.core.types import Completion
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.modeling.logprobs import pack_completions
from polyrl.modeling.probes import shortcut_refusal
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm
from polyrl.rollout.batches import LearnerBatch


def test_update_computes_only_the_micro_batches_own_lengths_and_still_learns():
    # Total lengths (prompt + completion): 3, 10, 4, 9 → the batch is padded to S = 10 columns.
    rows = [([5, 6], [7]), ([5, 6, 7], [8, 9, 10, 11, 12, 13, 14]), ([12], [7, 8, 9]), ([12, 5], [8, 9, 10, 11, 12, 13, 14])]
    completions = [
        Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-3.0] * len(c), finish_reason="stop")
        for p, c in rows
    ]
    packed = pack_completions(completions, pad_token_id=0)
    assert packed.input_ids.shape == (4, 10)
    batch = LearnerBatch(
        packed=packed, old_logprobs=None, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * packed.response_mask
    )
    policy = build_tiny_causal_lm(build_char_tokenizer(), "0.3m", seed=0)
    objective = get_objective("dr_grpo")
    learner = PolicyLearner(
        policy,
        objective,
        LearnerSettings(aggregation=objective.default_aggregation, learning_rate=1e-2, micro_batch_size=2, max_tokens=8),
    )
    positions = []
    assert shortcut_refusal(policy) is None  # set-up's probe, before the forwards counted here
    policy.get_decoder().register_forward_pre_hook(lambda _m, _a, kw: positions.append(kw["input_ids"].shape), with_kwargs=True)
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = learner.update(batch)
    # Longest first: rows 1 and 3 (10 and 9 tokens) then rows 2 and 0 (4 and 3): micro-batches
    # of 2 × 10 and 2 × 4 = 28 positions instead of 2 × (2 × 10) = 40 unsorted and untrimmed.
    assert positions == [torch.Size([2, 10]), torch.Size([2, 4])]
    assert math.isfinite(metrics["actor/loss"]) and metrics["actor/optimizer_steps"] == 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))
