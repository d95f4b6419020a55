"""Learner numerics: mixed precision, dropout, entropy gradient, non-finite steps,
the learning-rate schedule, and split invariance of every objective's update."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from learner_helpers import built, changed_fraction, first_batch, snapshot
from safetensors.torch import load_file

from polyrl.algos.aggregation import global_loss_normalizer
from polyrl.algos.objectives import list_objectives
from polyrl.core.errors import PolyrlError
from polyrl.core.types import Completion
from polyrl.learner.lr_schedule import lr_factor
from polyrl.learner.nonfinite import NonFiniteTrainingError
from polyrl.modeling.attention import FP32_CPU_SDPA
from polyrl.modeling.logprobs import pack_completions, token_logprobs
from polyrl.modeling.packing import base_attention
from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm, save_model_dir

# --- mixed precision -------------------------------------------------------------------------


def test_bf16_compute_keeps_fp32_master_weights_so_lr_1e_6_moves_most_weights(tmp_path, tiny_experiment):
    # In pure bf16 an Adam step of 1e-6 is below half a rounding step of almost every weight
    # (bf16 spacing near 0.05 is 2^-12 ≈ 2.4e-4): under 2% of them moved. fp32 masters keep it.
    config = tiny_experiment(
        model={"dtype": "bfloat16"},
        objective={"name": "ppo"},
        train={"steps": 1, "learning_rate": 1e-6, "micro_batch_size": 16, "value": {"learning_rate": 1e-6}},
    )
    with built(tmp_path, config) as arm:
        policy, critic = arm.learner.policy, arm.critic.model
        compute = []
        policy.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: compute.append(o.dtype))
        critic.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: compute.append(o.dtype))
        policy_before, critic_before = snapshot(policy), snapshot(critic)
        metrics = arm.loop().step()
    assert math.isfinite(metrics["actor/loss"]) and metrics["value/updates"] == 1.0
    assert compute and set(compute) == {torch.bfloat16}
    # Their attention kernels run in fp32 (torch's CPU flash-attention backward is slow in bf16); the
    # policy's through the padding-free wrapper (train.padding_free: auto).
    assert base_attention(policy) == critic.model.config._attn_implementation == FP32_CPU_SDPA
    for model, optimizer in ((policy, arm.learner.optimizer), (critic, arm.critic.optimizer)):
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert {s["exp_avg"].dtype for s in optimizer.state.values()} == {torch.float32}
    assert changed_fraction(policy_before, policy) > 0.9
    assert changed_fraction(critic_before, critic) > 0.9


# --- dropout -----------------------------------------------------------------------------------


def test_dropout_is_off_in_logprob_passes_and_in_the_update(tmp_path, tiny_experiment):
    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(tokenizer, "0.3m", seed=0)
    model.config.attention_dropout = 0.1
    path = save_model_dir(model, tokenizer, tmp_path / "dropout_model")
    # Two passes per batch, so π_old comes from a separate no-grad pass.
    config = tiny_experiment(model={"path": str(path)}, train={"steps": 1, "updates_per_batch": 2})
    with built(tmp_path, config) as arm:
        assert arm.learner.policy.config.attention_dropout == 0.1
        rollout, scores, batch = first_batch(arm)
        again = arm.pipeline.run(rollout, scores)
        rows = torch.arange(len(batch.packed))
        normalizer = global_loss_normalizer(batch.loss_mask, mode=arm.learner.settings.aggregation)
        _, metrics, logprobs = arm.learner.policy_loss(batch, rows, normalizer)
    assert torch.equal(batch.old_logprobs, again.old_logprobs)
    # The update's first forward is the same function of the weights as π_old's: ratio = 1.
    assert metrics["ratio_min"] == pytest.approx(1.0, abs=1e-6) and metrics["ratio_max"] == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(logprobs.detach(), batch.old_logprobs, atol=1e-6, rtol=0)


# --- entropy -----------------------------------------------------------------------------------


def test_entropy_takes_part_in_the_gradient_only_with_an_entropy_bonus(tmp_path, tiny_experiment):
    seen = {}
    for coef in (0.0, 0.01):
        with built(tmp_path, tiny_experiment(train={"steps": 1, "entropy_coef": coef})) as arm:
            fn = arm.learner.objective.fn

            def spy(*args, entropy=None, _fn=fn, _coef=coef, **kwargs):
                seen[_coef] = entropy.requires_grad
                return _fn(*args, entropy=entropy, **kwargs)

            arm.learner.objective = dataclasses.replace(arm.learner.objective, fn=spy)
            metrics = arm.loop().step()
        assert math.isfinite(metrics["actor/entropy"]) and metrics["actor/entropy"] > 0
    assert seen == {0.0: False, 0.01: True}


def test_token_entropy_is_finite_with_minus_inf_logits_and_matches_with_or_without_grad():
    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(tokenizer, "0.3m", seed=3).eval()
    completions = [Completion(prompt_ids=[5, 6], completion_ids=[7, 8, 9], text="", sampling_logprobs=[], finish_reason="stop")]
    batch = pack_completions(completions, pad_token_id=0)
    banned = torch.ones(len(tokenizer), dtype=torch.bool)
    banned[[7, 8, 9, 10]] = False  # a vocabulary mask (e.g. a grammar) leaves 4 tokens
    model.lm_head.register_forward_hook(lambda m, i, out: out.masked_fill(banned, -math.inf))
    logp, entropy = token_logprobs(model, batch, compute_entropy=True)
    (logp.sum() + entropy.sum()).backward()
    assert torch.isfinite(entropy).all() and (entropy > 0).all() and (entropy <= math.log(4) + 1e-6).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    logp_no, entropy_no = token_logprobs(model, batch, compute_entropy=True, entropy_grad=False)
    assert logp_no.requires_grad and not entropy_no.requires_grad
    torch.testing.assert_close(entropy_no, entropy.detach(), atol=0, rtol=0)


# --- non-finite steps --------------------------------------------------------------------------


def test_a_nan_loss_or_grad_norm_skips_the_step_and_says_which(tmp_path, tiny_experiment):
    with built(tmp_path, tiny_experiment(train={"steps": 2})) as arm:
        learner = arm.learner
        _, _, batch = first_batch(arm)
        before = snapshot(learner.policy)
        row, col = batch.loss_mask.nonzero()[0].tolist()
        nan_batch = dataclasses.replace(batch, advantages=batch.advantages.clone())
        nan_batch.advantages[row, col] = math.nan
        by_loss = learner.update(nan_batch)
        hook = learner.policy.model.norm.weight.register_hook(lambda grad: grad * math.inf)
        by_grad = learner.update(batch)
        hook.remove()
        assert changed_fraction(before, learner.policy) == 0.0 and not learner.optimizer.state
        assert learner.optimizer_step == 0 and learner.guard.consecutive == 2
        good = learner.update(batch)
        warnings = arm.health.check(1, {**by_loss}) + arm.health.check(2, {**by_grad})
    assert math.isnan(by_loss["actor/loss"])
    assert by_loss["health/nonfinite_steps"] == 1 and by_loss["health/nonfinite_loss_steps"] == 1
    assert math.isfinite(by_grad["actor/loss"]) and by_grad["health/nonfinite_grad_norm_steps"] == 1
    assert good["health/nonfinite_steps"] == 0 and learner.optimizer_step == 1 and learner.guard.consecutive == 0
    assert changed_fraction(before, learner.policy) > 0.5
    warnings = [w for w in warnings if w.startswith("nonfinite")]
    assert [w.split(":")[0] for w in warnings] == ["nonfinite_loss", "nonfinite_grad_norm"]
    assert "policy loss was NaN/inf" in warnings[0] and "policy gradient norm was NaN/inf" in warnings[1]


def test_consecutive_nonfinite_steps_stop_the_run_with_a_checkpoint_of_the_last_good_weights(tmp_path, tiny_experiment):
    config = tiny_experiment(train={"steps": 4, "max_consecutive_nonfinite": 2}, checkpoint={"every": 10})
    printed: list[str] = []
    with built(tmp_path, config) as arm:
        loop = arm.loop(printer=printed.append)
        loop.step()
        good = snapshot(arm.learner.policy)
        arm.learner.policy.lm_head.register_forward_hook(lambda m, i, out: out * math.nan)
        loop.step()  # skipped, the run goes on
        with pytest.raises(NonFiniteTrainingError) as caught:
            loop.step()
    assert isinstance(caught.value, PolyrlError)
    message = str(caught.value)
    assert "2 optimizer steps in a row" in message and "policy loss" in message and "train.max_consecutive_nonfinite" in message
    assert any("nonfinite_loss" in line for line in printed)
    checkpoint = tmp_path / "runs" / "main" / "step_000002"
    assert str(checkpoint) in message
    saved = load_file(str(checkpoint / "policy.safetensors"))
    assert all(torch.equal(saved[name], good[name]) for name in good)
    info = json.loads((checkpoint / "checkpoint.json").read_text())
    assert info["step"] == 2 and info["optimizer_step"] == 1 and info["nonfinite"] == {"consecutive": 0}


# --- learning-rate schedule ---------------------------------------------------------------------


def test_lr_factor_by_hand():
    # S = 4 optimizer steps, W = 1 warm-up step.
    # warm-up: s/(W+1) = 1/2; then p = (s - W - 1)/(S - W) = 0, 1/3, 2/3 for s = 2, 3, 4.
    linear = [lr_factor(s, schedule="linear", warmup_steps=1, total_steps=4) for s in (1, 2, 3, 4)]
    assert linear == pytest.approx([0.5, 1.0, 2 / 3, 1 / 3], abs=1e-12)
    # cosine to m = 0.1: m + (1-m)(1+cos(pi p))/2 = 1, 0.1 + 0.45*1.5 = 0.775, 0.1 + 0.45*0.5 = 0.325
    cosine = [lr_factor(s, schedule="cosine", warmup_steps=1, total_steps=4, min_lr_ratio=0.1) for s in (1, 2, 3, 4)]
    assert cosine == pytest.approx([0.5, 1.0, 0.775, 0.325], abs=1e-12)
    assert [lr_factor(s, schedule="constant", warmup_steps=2, total_steps=4) for s in (1, 2, 3, 4)] == pytest.approx(
        [1 / 3, 2 / 3, 1, 1]
    )
    # linear without warm-up over 2 steps: 1, then 1 - 1/2
    assert [lr_factor(s, schedule="linear", warmup_steps=0, total_steps=2) for s in (1, 2)] == pytest.approx([1.0, 0.5])


def test_the_schedule_runs_per_optimizer_step_is_logged_and_survives_a_resume_with_the_config_as_truth(tmp_path, tiny_experiment):
    schedule = {"learning_rate": 1e-3, "lr_schedule": "linear", "warmup_steps": 1, "steps": 4}
    with built(tmp_path, tiny_experiment(train=schedule, checkpoint={"every": 2})) as arm:
        loop = arm.loop()
        history = [loop.step() for _ in range(2)]
        assert arm.learner.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)  # the rate step 2 used
    assert [h["actor/learning_rate"] for h in history] == pytest.approx([5e-4, 1e-3], rel=1e-12)

    # The resumed config changes the rate, betas and weight decay: all of them apply.
    changed = {**schedule, "learning_rate": 2e-3, "betas": [0.8, 0.95], "weight_decay": 0.1}
    with built(tmp_path, tiny_experiment(train=changed, checkpoint={"every": 2}), resume=True) as resumed:
        loop = resumed.loop()
        assert loop.step_index == 2 and resumed.learner.optimizer_step == 2
        optimizer = resumed.learner.optimizer
        group = optimizer.param_groups[0]
        assert group["betas"] == (0.8, 0.95) and group["weight_decay"] == 0.1
        assert all("exp_avg" in state for state in optimizer.state.values())  # Adam moments restored
        later = [loop.step() for _ in range(2)]
        assert float(next(iter(optimizer.state.values()))["step"]) == 4.0
    # steps 3 and 4: 2e-3 × (2/3, 1/3)
    assert [h["actor/learning_rate"] for h in later] == pytest.approx([2e-3 * 2 / 3, 2e-3 / 3], rel=1e-12)


# --- split invariance --------------------------------------------------------------------------


@pytest.mark.parametrize("objective", [spec.name for spec in list_objectives()])
def test_one_sgd_update_is_the_same_for_any_micro_batch_size(tmp_path, tiny_experiment, objective):
    """Micro-batch size = mini-batch size vs 1: the same parameters after one SGD update.

    float64 and plain SGD, so the comparison measures the maths, not rounding that Adam's
    normalisation would amplify. π_old is perturbed on half of the rows (ratios 0.5..2), so
    clipping, BAPO's bound search and GSPO's sequence clip all take part.
    """
    config = tiny_experiment(
        objective={"name": objective},
        rollout={"prompts_per_step": 2},
        train={"steps": 1, "learning_rate": 1e-2, "micro_batch_size": 16, "kl_coef": 0.01, "entropy_coef": 0.01},
    )
    with built(tmp_path, config) as arm:
        learner = arm.learner
        learner.policy.double()
        arm.reference.double()
        _, _, batch = first_batch(arm)
        with torch.no_grad():
            current, _ = token_logprobs(learner.policy, batch.packed)
        noise = torch.randn(current.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.3
        noise[::2] = 0.0
        batch = dataclasses.replace(
            batch, old_logprobs=torch.where(batch.loss_mask, current + noise, current), advantages=batch.advantages.double()
        )
        start = snapshot(learner.policy)
        deltas = []
        # A row count of 16 and of 1, and a token budget that cuts the batch unevenly by length.
        budget = int(batch.packed.attention_mask.sum(dim=1).max()) * 3
        for micro, tokens in ((16, None), (1, None), (16, budget)):
            learner.policy.load_state_dict(start, strict=False)
            learner.optimizer = torch.optim.SGD(learner.policy.parameters(), lr=1e-2)
            learner.settings = dataclasses.replace(learner.settings, micro_batch_size=micro, micro_batch_tokens=tokens)
            metrics = learner.update(batch)
            assert metrics["health/nonfinite_steps"] == 0
            deltas.append(torch.cat([(p.detach() - start[n]).flatten() for n, p in learner.policy.named_parameters()]))
    full, single, by_tokens = deltas
    assert float(full.norm()) > 0
    assert float((full - single).norm() / full.norm()) < 1e-6
    assert float((full - by_tokens).norm() / full.norm()) < 1e-6
