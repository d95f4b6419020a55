import math

import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

from polyrl.algos.advantages import get_advantage
from polyrl.algos.aggregation import AGGREGATION_MODES, global_loss_normalizer
from polyrl.algos.objectives import SHARED_PARAMS, TRAIN_SETTINGS, get_objective, list_objectives
from polyrl.cli.objectives import app

F64 = torch.float64
NAN = math.nan
EXPECTED_OBJECTIVES = {"ppo", "grpo", "dr_grpo", "dapo", "gspo", "gspo_token", "bapo",
                       # the 2025-26 ones, tested by hand in test_objectives_2026.py
                       "cispo", "gpg", "sapo", "gmpo", "clip_cov", "kl_cov", "rloo", "reinforce_pp",
                       "reinforce_pp_baseline", "remax"}  # fmt: skip

# The shared 2x3 example. Row 0 has two response tokens, row 1 three.
#   token      p_new  p_old  ratio r  A
#   (0, 0)     0.6    0.4    1.5      +1
#   (0, 1)     0.2    0.4    0.5      -1
#   (0, 2)     masked (garbage in the dirty copies)
#   (1, 0)     0.55   0.5    1.1      -2
#   (1, 1)     0.35   0.5    0.7      +2
#   (1, 2)     0.9    0.9    1.0      +0.5
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
NEW_P = [[0.6, 0.2, 0.5], [0.55, 0.35, 0.9]]
OLD_P = [[0.4, 0.4, 0.5], [0.5, 0.5, 0.9]]
TOKEN_ADV = [[1.0, -1.0, 0.0], [-2.0, 2.0, 0.5]]
SEQUENCE_ADV = [[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]
S0 = math.sqrt(1.5 * 0.5)  # GSPO sequence ratio of row 0: geometric mean of 1.5 and 0.5
S1 = (1.1 * 0.7 * 1.0) ** (1 / 3)  # row 1: geometric mean of 1.1, 0.7, 1.0


def _inputs(advantages=TOKEN_ADV):
    logprobs = torch.tensor(NEW_P, dtype=F64).log().requires_grad_(True)
    old_logprobs = torch.tensor(OLD_P, dtype=F64).log()
    return logprobs, old_logprobs, torch.tensor(advantages, dtype=F64), MASK


def _run(name, *, aggregation=None, advantages=TOKEN_ADV, max_response_length=None, **params):
    spec = get_objective(name)
    aggregation = aggregation or spec.default_aggregation
    logprobs, old_logprobs, adv, mask = _inputs(advantages)
    normalizer = global_loss_normalizer(mask, mode=aggregation, max_response_length=max_response_length)
    loss, metrics = spec.fn(
        logprobs, old_logprobs, adv, mask, loss_normalizer=normalizer, aggregation=aggregation,
        **{**spec.default_params, **params},
    )  # fmt: skip
    loss.backward()
    return float(loss.detach()), logprobs.grad, metrics


def _close(actual, expected):
    assert actual == pytest.approx(expected, abs=1e-9, rel=0)


def test_ppo_by_hand():
    loss, grad, metrics = _run("ppo")
    # bounds [0.8, 1.2]; per-token loss max(-r*A, -clip(r)*A):
    #   (0,0) r 1.5 A +1: max(-1.5, -1.2) = -1.2 (clipped)
    #   (0,1) r 0.5 A -1: max(0.5, 0.8)   =  0.8 (clipped)
    #   (1,0) r 1.1 A -2: max(2.2, 2.2)   =  2.2
    #   (1,1) r 0.7 A +2: max(-1.4, -1.6) = -1.4
    #   (1,2) r 1.0 A .5:                 = -0.5
    # token_mean: (-1.2 + 0.8 + 2.2 - 1.4 - 0.5) / 5 = -0.1 / 5 = -0.02
    _close(loss, -0.02)
    # d/dlogp = -A*r / 5 where unclipped, 0 where clipped: 2.2/5, -1.4/5, -0.5/5
    expected_grad = torch.tensor([[0.0, 0.0, 0.0], [0.44, -0.28, -0.1]], dtype=F64)
    torch.testing.assert_close(grad, expected_grad, atol=1e-12, rtol=0)
    _close(metrics["clip_frac_low"], 1 / 5)  # (0,1): A<0, r 0.5 < 0.8
    _close(metrics["clip_frac_high"], 1 / 5)  # (0,0): A>0, r 1.5 > 1.2
    _close(metrics["ratio_mean"], (1.5 + 0.5 + 1.1 + 0.7 + 1.0) / 5)
    _close(metrics["ratio_min"], 0.5)
    _close(metrics["ratio_max"], 1.5)
    # approx_kl: (r - 1) - ln r per token, the k3 estimate of KL(pi_old || pi_theta) that is
    # unbiased under the pi_old samples the update trains on:
    #   r 1.5:  0.5 - 0.4054651081 = 0.0945348919
    #   r 0.5: -0.5 + 0.6931471806 = 0.1931471806
    #   r 1.1:  0.1 - 0.0953101798 = 0.0046898202
    #   r 0.7: -0.3 + 0.3566749439 = 0.0566749439
    #   r 1.0:  0
    # mean 0.3490468366 / 5 = 0.0698093673 (the old 1/r + ln r - 1 gave 0.0910564335)
    assert metrics["approx_kl"] == pytest.approx(0.0698093673, abs=1e-10, rel=0)
    # |loss| of A>0 tokens 1.2 + 1.4 + 0.5 = 3.1; of A<0 tokens 0.8 + 2.2 = 3.0
    _close(metrics["pos_loss_share"], 3.1 / 6.1)
    # p_new >= 0.5: (0,0) pos, (1,0) neg, (1,2) pos;  p_new < 0.5: (0,1) neg, (1,1) pos
    _close(metrics["quadrant/high_prob_pos_adv"], 2 / 5)
    _close(metrics["quadrant/high_prob_neg_adv"], 1 / 5)
    _close(metrics["quadrant/low_prob_pos_adv"], 1 / 5)
    _close(metrics["quadrant/low_prob_neg_adv"], 1 / 5)
    assert "kl" not in metrics and "entropy" not in metrics


def test_positive_share_is_bapos_balance_at_the_objectives_own_bounds():
    # |r*A| of the tokens the clip keeps (A>0 with r <= high, A<0 with r >= low):
    #   (0,0) r 1.5 A +1 · (0,1) r 0.5 A -1 · (1,0) r 1.1 A -2 · (1,1) r 0.7 A +2 · (1,2) r 1.0 A +0.5
    # PPO [0.8, 1.2]: (0,0) 1.5 > 1.2 and (0,1) 0.5 < 0.8 are left out;
    #   pos = 0.7*2 + 1.0*0.5 = 1.9, neg = 1.1*2 = 2.2 -> 1.9 / 4.1
    _, _, metrics = _run("ppo")
    _close(metrics["positive_share"], 1.9 / 4.1)
    # DAPO's clip-higher at 1.6 keeps (0,0): pos = 1.5 + 1.9 = 3.4 -> 3.4 / 5.6
    _, _, metrics = _run("dapo", clip_high=0.6)
    _close(metrics["positive_share"], 3.4 / 5.6)
    # ... and a lower bound of 0.4 keeps (0,1): neg = 2.2 + 0.5 = 2.7 -> 1.9 / 4.6
    _, _, metrics = _run("ppo", clip_low=0.6)
    _close(metrics["positive_share"], 1.9 / 4.6)
    # BAPO at its start bounds [0.6, 1.2] (no search: bound_search off) agrees with its own metric:
    # (0,1) 0.5 < 0.6 is left out, as under PPO -> 1.9 / 4.1
    _, _, metrics = _run("bapo", bound_search=False)
    _close(metrics["positive_share"], 1.9 / 4.1)
    _close(metrics["bapo/positive_share"], 1.9 / 4.1)
    # no token with A != 0: nothing to balance, the metric is left out rather than logged as 0 or 1,
    # and so is BAPO's own (its search stops at the value 1.0 there, which is no measured balance)
    _, _, metrics = _run("ppo", advantages=[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert "positive_share" not in metrics
    _, _, metrics = _run("bapo", advantages=[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert "positive_share" not in metrics and "bapo/positive_share" not in metrics
    assert (metrics["bapo/c_low"], metrics["bapo/c_high"]) == (0.6, 1.2)  # still logged: the search stopped at once


def test_quadrant_threshold_is_a_parameter():
    # threshold 0.58: only (0,0) p 0.6 and (1,2) p 0.9 are high-probability, both A>0
    _, _, metrics = _run("ppo", high_prob_threshold=0.58)
    _close(metrics["quadrant/high_prob_pos_adv"], 2 / 5)
    _close(metrics["quadrant/high_prob_neg_adv"], 0.0)
    _close(metrics["quadrant/low_prob_pos_adv"], 1 / 5)
    _close(metrics["quadrant/low_prob_neg_adv"], 2 / 5)


def test_grpo_by_hand():
    loss, _, _ = _run("grpo")
    # same per-token losses as PPO; row means (-1.2 + 0.8) / 2 = -0.2 and (2.2 - 1.4 - 0.5) / 3 = 0.1
    # seq_mean_token_mean: (-0.2 + 0.1) / 2 = -0.05
    _close(loss, -0.05)


def test_dr_grpo_by_hand():
    loss, _, _ = _run("dr_grpo", max_response_length=4)
    # seq_sum_constant_norm: sum -0.1 / (2 sequences * L_max 4) = -0.0125
    _close(loss, -0.0125)


def test_dapo_by_hand():
    loss, grad, metrics = _run("dapo")
    # bounds [0.8, 1.28]: (0,0) max(-1.5, -1.28) = -1.28; the other tokens as in PPO
    # token_mean: (-1.28 + 0.8 + 2.2 - 1.4 - 0.5) / 5 = -0.18 / 5 = -0.036
    _close(loss, -0.036)
    _close(metrics["clip_frac_high"], 1 / 5)


def test_ppo_dual_clip_by_hand():
    logprobs = torch.tensor([[math.log(0.8), math.log(0.4)]], dtype=F64, requires_grad=True)
    old_logprobs = torch.tensor([[math.log(0.2), math.log(0.2)]], dtype=F64)
    advantages = torch.tensor([[-1.0, -1.0]], dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    spec = get_objective("ppo")
    loss, metrics = spec.fn(
        logprobs, old_logprobs, advantages, mask, loss_normalizer=2.0, aggregation="token_mean", dual_clip=3.0
    )
    loss.backward()
    # r = 4, A = -1: max(4, 1.2) = 4, capped at 3 * |A| = 3;  r = 2: max(2, 1.2) = 2 < 3
    # token_mean (3 + 2) / 2 = 2.5; the capped token has no gradient, the other -A*r/2 = 1
    _close(loss.item(), 2.5)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 1.0]], dtype=F64), atol=1e-12, rtol=0)
    _close(metrics["dual_clip_frac"], 0.5)
    with pytest.raises(ValueError, match="dual_clip"):
        spec.fn(logprobs, old_logprobs, advantages, mask, loss_normalizer=2.0, aggregation="token_mean", dual_clip=0.5)


def test_gspo_by_hand():
    loss, grad, metrics = _run("gspo", advantages=SEQUENCE_ADV)
    # bounds [1 - 3e-4, 1 + 4e-4] = [0.9997, 1.0004]
    # row 0: s0 = sqrt(0.75) = 0.866025, A +1: max(-s0, -0.9997) = -s0 (unclipped)
    # row 1: s1 = 0.77^(1/3) = 0.916566, A -1: max(s1, 0.9997) = 0.9997 (clipped)
    # seq_mean_token_mean: (-s0 + 0.9997) / 2
    _close(loss, (-S0 + 0.9997) / 2)
    # d(-s0 / 2)/d logp_(0,t) = -s0 / 2 * 1/2 tokens; row 1 is clipped
    expected_grad = torch.tensor([[-S0 / 4, -S0 / 4, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, expected_grad, atol=1e-12, rtol=0)
    _close(metrics["clip_frac_low"], 3 / 5)  # all 3 tokens of row 1
    _close(metrics["ratio_mean"], (2 * S0 + 3 * S1) / 5)


def test_gspo_with_wider_range_by_hand():
    loss, _, _ = _run("gspo", advantages=SEQUENCE_ADV, clip_low=0.2, clip_high=0.2)
    # both sequence ratios lie in [0.8, 1.2]: (-s0 + s1) / 2
    _close(loss, (-S0 + S1) / 2)


def test_gspo_token_by_hand_with_token_advantages():
    loss, _, _ = _run("gspo_token")
    # s_(i,t) has the value s_i; bounds [0.9997, 1.0004]
    # row 0: A +1: -s0;  A -1: max(s0, 0.9997) = 0.9997            -> (-s0 + 0.9997) / 2
    # row 1: A -2: max(2 s1, 1.9994) = 1.9994; A +2: -2 s1; A .5: -0.5 s1 -> (1.9994 - 2.5 s1) / 3
    _close(loss, ((-S0 + 0.9997) / 2 + (1.9994 - 2.5 * S1) / 3) / 2)


def test_gspo_token_equals_gspo_for_sequence_advantages():
    for params in ({}, {"clip_low": 0.2, "clip_high": 0.2}):
        loss, grad, _ = _run("gspo", advantages=SEQUENCE_ADV, **params)
        token_loss, token_grad, _ = _run("gspo_token", advantages=SEQUENCE_ADV, **params)
        _close(token_loss, loss)
        torch.testing.assert_close(token_grad, grad, atol=1e-12, rtol=0)


def test_kl_term_in_the_loss_by_hand():
    logprobs, old_logprobs, _, _ = _inputs()
    loss, _, metrics = _run("ppo", ref_logprobs=old_logprobs, kl_coef=0.1, kl_estimator="k1")
    # k1 = log p - log ref = ln r; sum ln r = ln(1.5 * 0.5 * 1.1 * 0.7 * 1.0) = ln 0.5775
    # loss = -0.02 + 0.1 * ln(0.5775) / 5
    _close(loss, -0.02 + 0.1 * math.log(0.5775) / 5)
    _close(metrics["kl"], math.log(0.5775) / 5)


def test_entropy_bonus_by_hand():
    entropy = torch.tensor([[1.0, 2.0, NAN], [0.5, 0.5, 1.0]], dtype=F64)
    spec = get_objective("ppo")
    logprobs, old_logprobs, advantages, mask = _inputs()
    loss, metrics = spec.fn(
        logprobs, old_logprobs, advantages, mask, loss_normalizer=5.0, aggregation="token_mean",
        entropy=entropy, entropy_coef=0.01,
    )  # fmt: skip
    # mean entropy (1 + 2 + 0.5 + 0.5 + 1) / 5 = 1; loss -0.02 - 0.01 * 1 = -0.03
    _close(loss.item(), -0.03)
    _close(metrics["entropy"], 1.0)


def test_missing_tensors_for_kl_or_entropy_are_reported():
    spec = get_objective("ppo")
    logprobs, old_logprobs, advantages, mask = _inputs()
    with pytest.raises(ValueError, match="ref_logprobs"):
        spec.fn(logprobs, old_logprobs, advantages, mask, loss_normalizer=5.0, aggregation="token_mean", kl_coef=0.1)
    with pytest.raises(ValueError, match="entropy"):
        spec.fn(logprobs, old_logprobs, advantages, mask, loss_normalizer=5.0, aggregation="token_mean", entropy_coef=0.1)


def test_log_ratio_is_clamped_at_20_by_hand():
    # float32, as training runs. Token 0: log-ratio 100 (exp(100) overflows float32 to inf), A -1;
    # token 1: log-ratio 0, A -1. The log-ratio is clamped to 20, so r0 = e^20 = 485165195.4:
    #   token 0: max(-A*r0, -A*clip(r0, 0.8, 1.2)) = max(e^20, 1.2) = e^20
    #   token 1: max(1, 1) = 1
    # token_mean: (e^20 + 1) / 2. Gradient: 0 for token 0 (beyond the clamp), -A*r/2 = 0.5 for token 1.
    logprobs = torch.tensor([[-0.5, -1.0]], dtype=torch.float32, requires_grad=True)
    old_logprobs = torch.tensor([[-100.5, -1.0]], dtype=torch.float32)
    advantages = torch.tensor([[-1.0, -1.0]], dtype=torch.float32)
    spec = get_objective("ppo")
    loss, metrics = spec.fn(logprobs, old_logprobs, advantages, torch.ones(1, 2, dtype=torch.bool),
                            loss_normalizer=2.0, aggregation="token_mean", **spec.default_params)  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx((math.exp(20) + 1) / 2, rel=1e-6)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.5]]), atol=1e-6, rtol=0)
    # approx_kl from the clamped log-ratio: ((e^20 - 1) - 20 + 0) / 2
    assert metrics["approx_kl"] == pytest.approx((math.exp(20) - 21) / 2, rel=1e-6)


@pytest.mark.parametrize("name", sorted(EXPECTED_OBJECTIVES))
def test_huge_log_ratio_with_negative_advantage_keeps_loss_and_gradients_finite(name):
    # Row 0: log-ratio 100 on both tokens (also GSPO's sequence log-ratio: exp(100) = inf in
    # float32); row 1: ordinary ratios. All advantages negative, so nothing clips the ratio away.
    spec = get_objective(name)
    logprobs = torch.tensor([[-0.5, -1.0], [-0.7, -0.2]], dtype=torch.float32, requires_grad=True)
    old_logprobs = logprobs.detach() - torch.tensor([[100.0, 100.0], [0.0, 0.1]])
    advantages = torch.full((2, 2), -1.0)
    mask = torch.ones(2, 2, dtype=torch.bool)
    aggregation = spec.default_aggregation
    loss, metrics = spec.fn(
        logprobs, old_logprobs, advantages, mask, loss_normalizer=global_loss_normalizer(mask, mode=aggregation),
        aggregation=aggregation, **spec.default_params,
    )  # fmt: skip
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logprobs.grad).all()
    assert all(math.isfinite(value) for value in metrics.values())


# ---------------------------------------------------------------------------------------------
# Invariances


def _dirty(tensor: torch.Tensor, garbage: float) -> torch.Tensor:
    return torch.where(MASK, tensor, torch.full_like(tensor, garbage))


@pytest.mark.parametrize("aggregation", AGGREGATION_MODES)
@pytest.mark.parametrize("name", sorted(EXPECTED_OBJECTIVES))
def test_garbage_under_mask_changes_neither_loss_nor_gradients(name, aggregation):
    spec = get_objective(name)
    clean_logprobs, old_logprobs, advantages, mask = _inputs()
    ref_logprobs = old_logprobs - 0.1
    entropy = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.5, 1.0]], dtype=F64)
    params = {**spec.default_params, "kl_coef": 0.1, "entropy_coef": 0.01}
    normalizer = global_loss_normalizer(mask, mode=aggregation)

    def run(logprobs, old, adv, ref, ent):
        loss, metrics = spec.fn(
            logprobs, old, adv, mask, loss_normalizer=normalizer, aggregation=aggregation,
            entropy=ent, **{**params, "ref_logprobs": ref},
        )  # fmt: skip
        loss.backward()
        return loss.detach(), metrics

    clean_loss, clean_metrics = run(clean_logprobs, old_logprobs, advantages, ref_logprobs, entropy)
    dirty_logprobs = _dirty(clean_logprobs.detach(), NAN).requires_grad_(True)
    dirty_loss, dirty_metrics = run(
        dirty_logprobs,
        _dirty(old_logprobs, -math.inf),
        _dirty(advantages, NAN),
        _dirty(ref_logprobs, 1e30),
        _dirty(entropy, NAN),
    )
    assert torch.isfinite(clean_loss)
    assert torch.equal(clean_loss, dirty_loss)
    assert torch.isfinite(dirty_logprobs.grad).all()
    assert torch.equal(clean_logprobs.grad, dirty_logprobs.grad)
    assert clean_metrics == dirty_metrics


def _tiny_policy_batch():
    """8 responses of different lengths scored by a shared linear softmax policy."""
    generator = torch.Generator().manual_seed(0)
    lengths = [1, 2, 3, 4, 5, 6, 2, 5]
    mask = torch.zeros(8, 6, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, :length] = True
    features = torch.randn(8, 6, 4, generator=generator, dtype=F64)
    tokens = torch.randint(0, 5, (8, 6), generator=generator)
    weight = torch.randn(4, 5, generator=generator, dtype=F64)
    old_weight = weight + 0.3 * torch.randn(4, 5, generator=generator, dtype=F64)
    rewards = torch.randn(8, generator=generator, dtype=F64)
    advantages = rewards[:, None].expand(8, 6).clone()
    return lengths, mask, features, tokens, weight, old_weight, advantages


def _token_logprobs(features, tokens, weight):
    return torch.log_softmax(features @ weight, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


@pytest.mark.parametrize("aggregation", AGGREGATION_MODES)
@pytest.mark.parametrize("name", ["ppo", "grpo", "dr_grpo", "dapo", "gspo", "gspo_token"])
def test_one_batch_of_8_equals_8_accumulated_micro_batches_of_1(name, aggregation):
    spec = get_objective(name)
    lengths, mask, features, tokens, weight, old_weight, advantages = _tiny_policy_batch()
    params = dict(spec.default_params)
    if name.startswith("gspo"):
        # The paper's 3e-4 range clips nearly every sequence here, leaving no gradient to compare.
        params.update(clip_low=0.2, clip_high=0.2)
    normalizer = global_loss_normalizer(mask, mode=aggregation, max_response_length=6)

    def loss_of(rows, length, model_weight):
        logprobs = _token_logprobs(features[rows, :length], tokens[rows, :length], model_weight)
        old = _token_logprobs(features[rows, :length], tokens[rows, :length], old_weight)
        loss, _ = spec.fn(
            logprobs, old, advantages[rows, :length], mask[rows, :length],
            loss_normalizer=normalizer, aggregation=aggregation, **params,
        )  # fmt: skip
        return loss

    full_weight = weight.clone().requires_grad_(True)
    loss_of(slice(0, 8), 6, full_weight).backward()
    micro_weight = weight.clone().requires_grad_(True)
    for row, length in enumerate(lengths):
        loss_of(slice(row, row + 1), length, micro_weight).backward()
    assert full_weight.grad.abs().max() > 1e-3
    torch.testing.assert_close(micro_weight.grad, full_weight.grad, atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------------
# Registry and CLI

REQUIRED_METRICS = {
    "clip_frac_low",
    "clip_frac_high",
    "ratio_mean",
    "ratio_min",
    "ratio_max",
    "approx_kl",
    "pos_loss_share",
    "positive_share",
    "quadrant/high_prob_pos_adv",
    "quadrant/high_prob_neg_adv",
    "quadrant/low_prob_pos_adv",
    "quadrant/low_prob_neg_adv",
    "entropy",
    "kl",
}


def test_registry_holds_the_expected_objectives_with_valid_defaults():
    assert {spec.name for spec in list_objectives()} == EXPECTED_OBJECTIVES
    for spec in list_objectives():
        assert spec.default_aggregation in AGGREGATION_MODES
        assert get_advantage(spec.default_advantage).name == spec.default_advantage
        assert spec.description and "arXiv" in spec.paper
        assert spec.fn.__doc__ and "arXiv" in spec.fn.__doc__


@pytest.mark.parametrize("name", sorted(EXPECTED_OBJECTIVES))
def test_every_objective_runs_with_the_common_signature(name):
    spec = get_objective(name)
    logprobs, old_logprobs, advantages, mask = _inputs()
    entropy = torch.ones(2, 3, dtype=F64)
    loss, metrics = spec.fn(
        logprobs, old_logprobs, advantages, mask,
        loss_normalizer=global_loss_normalizer(mask, mode=spec.default_aggregation),
        aggregation=spec.default_aggregation, entropy=entropy,
        **{**spec.default_params, "ref_logprobs": old_logprobs},
    )  # fmt: skip
    loss.backward()
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert REQUIRED_METRICS <= set(metrics)
    assert all(isinstance(value, float) for value in metrics.values())
    quadrants = [value for key, value in metrics.items() if key.startswith("quadrant/")]
    _close(sum(quadrants), 1.0)


def test_unknown_objective_lists_the_registered_names():
    with pytest.raises(ValueError, match="registered objectives: .*grpo.*bapo"):
        get_objective("trpo")


def test_objectives_list_command_shows_every_objective():
    result = CliRunner().invoke(app, ["list"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for spec in list_objectives():
        assert spec.name in result.output
    assert "arXiv 2510.18927" in result.output


def test_objectives_list_command_can_show_advantage_estimators():
    result = CliRunner().invoke(app, ["list", "--advantages"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for name in ("group_norm", "group_mean_centered", "rloo", "gae"):
        assert name in result.output


# ---------------------------------------------------------------------------------------------
# Typed params


def test_train_settings_are_not_objective_params():
    # kl_coef / kl_estimator / entropy_coef live in train.*; the functions still take them
    assert set(TRAIN_SETTINGS) == {"kl_coef", "kl_estimator", "entropy_coef"}
    assert not set(TRAIN_SETTINGS) & set(SHARED_PARAMS)
    for spec in list_objectives():
        assert not set(TRAIN_SETTINGS) & set(spec.default_params), spec.name
        assert not set(TRAIN_SETTINGS) & set(spec.params.model_fields), spec.name
        with pytest.raises(ValidationError, match="set train.kl_coef instead"):
            spec.validate_params({"kl_coef": 0.04})


@pytest.mark.parametrize(
    "name, params, fragment",
    [
        ("ppo", {"clip_low": "0.2"}, "valid number"),
        ("grpo", {"clip_high": True}, "valid number"),
        ("ppo", {"dual_clip": 0.5}, "greater than 1"),
        ("dapo", {"clip_low": -0.01}, "greater than or equal to 0"),
        ("gspo", {"clip_high": math.inf}, "finite"),
        ("bapo", {"c_low_start": 1.1}, "less than 1"),
        ("bapo", {"target_positive_share": 1.5}, "less than or equal to 1"),
        ("bapo", {"positive_weight_sign": 0.5}, "1 or -1"),
        ("bapo", {"bound_search": "no"}, "valid boolean"),
        ("ppo", {"c_low_start": 0.6}, "unknown parameter"),
    ],
)
def test_bad_params_are_refused_by_the_registration(name, params, fragment):
    with pytest.raises(ValidationError, match=fragment):
        get_objective(name).validate_params(params)


def test_validated_params_are_python_values_and_defaults_come_from_the_model():
    assert get_objective("ppo").validate_params({"clip_low": 0, "dual_clip": 3}) == {"clip_low": 0.0, "dual_clip": 3.0}
    assert type(get_objective("ppo").validate_params({"clip_low": 0})["clip_low"]) is float
    assert get_objective("dapo").default_params["clip_high"] == 0.28
    assert get_objective("gspo").default_params["clip_low"] == 3e-4
    for spec in list_objectives():
        assert spec.default_params == spec.params().model_dump()
        assert spec.validate_params({}) == {}


def test_objectives_show_lists_typed_params():
    result = CliRunner().invoke(app, ["show", "ppo"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "dual_clip" in result.output and "number > 1, or null" in result.output
    assert "train.*" in result.output
    result = CliRunner().invoke(app, ["show", "group_norm", "--advantage"], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "'group' or 'batch'" in result.output
    result = CliRunner().invoke(app, ["show", "trpo"])
    # Reported like every other command's user error: "error: ..." on stderr, exit 2, no traceback.
    assert result.exit_code == 2 and "registered objectives" in result.output and "Traceback" not in result.output
    assert result.output.startswith("error: unknown objective 'trpo'")
