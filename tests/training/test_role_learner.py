"""The policy learner alone: a tiny causal LM, a registered objective and a hand-made learner
batch. No engine, no rewards, no config file."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from polyrl.algos.objectives import get_objective
from polyrl.core.types import Completion
from polyrl.learner.nonfinite import NonFiniteStop
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.modeling.logprobs import pack_completions
from polyrl.modeling.probes import shortcut_refusal
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm
from polyrl.rollout.batches import LearnerBatch


def _batch() -> LearnerBatch:
    rows = [([5, 6], [7, 8, 9]), ([5, 6], [10, 11]), ([12], [7]), ([12], [8, 9, 10])]
    completions = [
        Completion(prompt_ids=p, completion_ids=c, text="", sampling_logprobs=[-3.0] * len(c), finish_reason="stop")
        for p, c in rows
    ]
    packed = pack_completions(completions, pad_token_id=0)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * packed.response_mask
    return LearnerBatch(packed=packed, old_logprobs=None, advantages=advantages)


def _learner(**settings) -> PolicyLearner:
    policy = build_tiny_causal_lm(build_char_tokenizer(), "0.3m", seed=0)
    objective = get_objective("grpo")
    defaults = dict(
        aggregation=objective.default_aggregation,
        objective_params=dict(objective.default_params),
        learning_rate=1e-2,
        micro_batch_size=2,
        total_steps=2,
    )
    return PolicyLearner(policy, objective, LearnerSettings(**{**defaults, **settings}))


def test_an_update_steps_once_per_mini_batch_on_the_schedule_and_moves_the_policy():
    learner = _learner(lr_schedule="linear", warmup_steps=1, mini_batches=2)
    before = {n: p.detach().clone() for n, p in learner.policy.named_parameters()}
    metrics = learner.update(_batch())
    # 2 mini-batches → 2 optimizer steps of 4 in all (2 training steps); warm-up W = 1:
    # step 1: 1/2 × 1e-2, step 2: p = 0 → 1e-2 (the rate logged is the last step's).
    assert learner.optimizer_step == 2 and metrics["actor/optimizer_steps"] == 2.0
    assert learner.learning_rate(1) == pytest.approx(5e-3) and metrics["actor/learning_rate"] == pytest.approx(1e-2)
    assert math.isfinite(metrics["actor/loss"]) and metrics["health/nonfinite_steps"] == 0
    assert "rollout/logprob_gap" in metrics  # π_old read off the update's own forward pass
    assert any(not torch.equal(before[n], p) for n, p in learner.policy.named_parameters())
    assert {p.dtype for p in learner.policy.parameters()} == {torch.float32} and not learner.policy.training
    # One update that moved the weights: weight version 1 (the synchronous loop's next sync sends it).
    assert learner.state_dict() == {"optimizer_step": 2, "weight_version": 1, "nonfinite": {"consecutive": 0}}


def test_non_finite_steps_are_skipped_counted_and_stop_after_too_many_in_a_row():
    learner = _learner(max_consecutive_nonfinite=2)
    batch = _batch()
    nan_batch = dataclasses.replace(batch, advantages=batch.advantages.clone())
    nan_batch.advantages[0, 0] = math.nan
    before = {n: p.detach().clone() for n, p in learner.policy.named_parameters()}
    first = learner.update(nan_batch)
    assert first["health/nonfinite_loss_steps"] == 1 and learner.optimizer_step == 0
    with pytest.raises(NonFiniteStop) as stop:
        learner.update(nan_batch)
    assert (stop.value.reason, stop.value.consecutive) == ("loss", 2)
    assert all(torch.equal(before[n], p) for n, p in learner.policy.named_parameters()) and not learner.optimizer.state


def test_a_restored_state_resumes_the_schedule_and_the_guard():
    learner = _learner(lr_schedule="linear", total_steps=4)
    learner.load_state_dict({"optimizer_step": 2, "nonfinite": {"consecutive": 1}})
    learner.apply_optimizer_settings()
    # linear over 4 optimizer steps, no warm-up: step 3 → 1 - 2/4 = 0.5
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(5e-3) and learner.guard.consecutive == 1


def test_weights_for_a_sync_come_in_the_engine_dtype():
    learner = _learner()
    weights = dict(learner.weights(torch.bfloat16))
    assert set(weights) == set(learner.policy.state_dict()) and {w.dtype for w in weights.values()} == {torch.bfloat16}


def test_the_update_hands_no_heap_pages_back_between_micro_batches(monkeypatch):
    """The update itself never trims the heap: a trim after each mini-batch's first backward cost
    SmolLM2-135M's fp32 update 37.3 s against 26.3 s without it, for the same peak RSS (5905 vs
    5892 MiB; bench/compare_trl.py --polyrl-arms, README "LoRA, export and memory"); the loop's
    trims before the update and before the sync stay (trainer/loop.py)."""
    import polyrl.learner.policy_learner as learner_module
    import polyrl.runtime.host_memory as host_memory

    calls = []
    real = host_memory.release_freed_host_memory
    monkeypatch.setattr(host_memory, "release_freed_host_memory", lambda: calls.append(1) or real())
    learner = _learner(mini_batches=2, micro_batch_size=1)  # 2 mini-batches of 2 rows, 2 micro-batches each
    learner.update(_batch())
    assert calls == [] and not hasattr(learner_module, "release_freed_host_memory")


def test_gradients_exist_before_the_first_forward_and_are_freed_after_the_update():
    """The gradients' memory is allocated when the update begins, before any activation, and
    reused by every mini-batch (runtime/gradient_buffers.py: autograd's own allocation, in the
    middle of the first backward, left SmolLM2-135M's update with 1.2-1.5 GiB of heap holes)."""
    learner = _learner(mini_batches=2, micro_batch_size=1)  # 2 mini-batches of 2 rows, 2 micro-batches each
    trainable = [p for p in learner.policy.parameters() if p.requires_grad]
    seen = []  # per forward: every gradient already allocated, and its storage
    assert shortcut_refusal(learner.policy) is None  # set-up's probe (no-grad forwards), before the count
    learner.policy.get_decoder().register_forward_pre_hook(
        lambda module, args: seen.append([p.grad.untyped_storage().data_ptr() if p.grad is not None else None for p in trainable])
    )
    learner.update(_batch())
    assert len(seen) == 4 and all(ptr is not None for ptr in seen[0])  # before: None at the first forward
    assert all(forward == seen[0] for forward in seen)  # one buffer per parameter for the whole update
    assert all(p.grad is None for p in trainable)  # freed at the update's end


def test_a_parameter_no_backward_reaches_gets_no_gradient_and_no_step():
    """With the buffers, as without: a parameter outside the graph keeps grad None, so AdamW
    neither decays nor moves it and keeps no state for it."""
    learner = _learner(mini_batches=2, weight_decay=0.1)
    learner.policy.unused = torch.nn.Parameter(torch.ones(3))
    learner.optimizer.add_param_group({"params": [learner.policy.unused]})
    learner.update(_batch())
    assert torch.equal(learner.policy.unused.detach(), torch.ones(3)) and learner.policy.unused not in learner.optimizer.state
    assert all(learner.optimizer.state[p] for p in learner.policy.parameters() if p is not learner.policy.unused)
