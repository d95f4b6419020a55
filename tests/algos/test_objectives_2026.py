"""The 2025-26 objectives (CISPO, GPG, SAPO, GMPO, Clip-Cov, KL-Cov and the PPO-clip
registrations RLOO, REINFORCE++, REINFORCE++-baseline, ReMax): values and gradients computed by
hand on small tensors, equality with verl's / TRL's formulas on the same tensors, invariance to
garbage under the mask and to the micro-batch split."""

import math

import pytest
import torch

from polyrl.algos.advantages import get_advantage
from polyrl.algos.aggregation import AGGREGATION_MODES, global_loss_normalizer
from polyrl.algos.objectives import get_objective

F64 = torch.float64
NAN = math.nan
NEW_OBJECTIVES = ["cispo", "gpg", "sapo", "gmpo", "clip_cov", "kl_cov", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax"]

# The shared 2x3 example of test_objectives.py. Row 0 has two response tokens, row 1 three.
#   token      p_new  p_old  ratio r  A (token)   A (sequence)
#   (0, 0)     0.6    0.4    1.5      +1          +1
#   (0, 1)     0.2    0.4    0.5      -1          +1
#   (0, 2)     masked (garbage in the dirty copies)
#   (1, 0)     0.55   0.5    1.1      -2          -1
#   (1, 1)     0.35   0.5    0.7      +2          -1
#   (1, 2)     0.9    0.9    1.0      +0.5        -1
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
NEW_P = [[0.6, 0.2, 0.5], [0.55, 0.35, 0.9]]
OLD_P = [[0.4, 0.4, 0.5], [0.5, 0.5, 0.9]]
TOKEN_ADV = [[1.0, -1.0, 0.0], [-2.0, 2.0, 0.5]]
SEQUENCE_ADV = [[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]
LN = math.log


def _inputs(advantages=TOKEN_ADV):
    logprobs = torch.tensor(NEW_P, dtype=F64).log().requires_grad_(True)
    old_logprobs = torch.tensor(OLD_P, dtype=F64).log()
    return logprobs, old_logprobs, torch.tensor(advantages, dtype=F64), MASK


def _run(name, *, aggregation=None, advantages=TOKEN_ADV, **params):
    spec = get_objective(name)
    aggregation = aggregation or spec.default_aggregation
    logprobs, old_logprobs, adv, mask = _inputs(advantages)
    normalizer = global_loss_normalizer(mask, mode=aggregation)
    loss, metrics = spec.fn(
        logprobs, old_logprobs, adv, mask, loss_normalizer=normalizer, aggregation=aggregation,
        **{**spec.default_params, **params},
    )  # fmt: skip
    loss.backward()
    return float(loss.detach()), logprobs.grad, metrics


def _close(actual, expected):
    actual, expected = (float(v.detach()) if isinstance(v, torch.Tensor) else v for v in (actual, expected))
    assert actual == pytest.approx(expected, abs=1e-12, rel=0)


def _grad(rows):
    return torch.tensor(rows, dtype=F64)


# ---------------------------------------------------------------------------------------------
# CISPO


def test_cispo_by_hand_keeps_every_tokens_gradient():
    loss, grad, metrics = _run("cispo")
    # Defaults: no lower bound, cap 1 + 4 = 5; no ratio here reaches it, so w = r.
    # per token -w * A * log p:
    #   (0,0) -1.5 * (+1) * ln 0.6    (0,1) -0.5 * (-1) * ln 0.2
    #   (1,0) -1.1 * (-2) * ln 0.55   (1,1) -0.7 * (+2) * ln 0.35   (1,2) -1.0 * 0.5 * ln 0.9
    # token_mean over the 5 response tokens.
    expected = (-1.5 * LN(0.6) + 0.5 * LN(0.2) + 2.2 * LN(0.55) - 1.4 * LN(0.35) - 0.5 * LN(0.9)) / 5
    _close(loss, expected)
    # d/dlog p = -w * A / 5 on every token, the two PPO would clip included:
    #   (0,0) -1.5/5 = -0.3   (0,1) +0.5/5 = 0.1   (1,0) 2.2/5 = 0.44   (1,1) -1.4/5 = -0.28   (1,2) -0.5/5 = -0.1
    torch.testing.assert_close(grad, _grad([[-0.3, 0.1, 0.0], [0.44, -0.28, -0.1]]), atol=1e-12, rtol=0)
    _close(metrics["cispo/weight_clip_frac"], 0.0)
    _close(metrics["clip_frac_low"], 0.0)  # no gradient is zeroed
    _close(metrics["clip_frac_high"], 0.0)


def test_cispo_with_both_bounds_by_hand():
    loss, grad, metrics = _run("cispo", clip_low=0.2, clip_high=0.2)
    # w = clip(r, 0.8, 1.2): 1.5 -> 1.2, 0.5 -> 0.8, 1.1, 0.7 -> 0.8, 1.0
    expected = (-1.2 * LN(0.6) + 0.8 * LN(0.2) + 2.2 * LN(0.55) - 1.6 * LN(0.35) - 0.5 * LN(0.9)) / 5
    _close(loss, expected)
    # -w * A / 5: -1.2/5, 0.8/5, 2.2/5, -1.6/5, -0.5/5 (the clipped tokens still learn)
    torch.testing.assert_close(grad, _grad([[-0.24, 0.16, 0.0], [0.44, -0.32, -0.1]]), atol=1e-12, rtol=0)
    _close(metrics["cispo/weight_clip_frac"], 3 / 5)  # (0,0), (0,1), (1,1)


def _verl_cispo(logprobs, old, adv, mask, low, high):
    """verl core_algos.compute_policy_loss_cispo with loss_agg_mode token-mean, written out."""
    ratio = torch.exp(torch.clamp(logprobs - old, -20, 20))
    weight = torch.clamp(ratio, 1 - low, 1 + high).detach()
    per_token = -weight * adv * logprobs
    return (per_token * mask).sum() / mask.sum()


def _trl_cispo(logprobs, old, adv, mask, epsilon_high):
    """TRL GRPOTrainer loss_type 'cispo' (token level), written out: cap at epsilon_high, global token mean."""
    weight = torch.clamp(torch.exp(logprobs - old), max=epsilon_high).detach()
    per_token = -weight * adv * logprobs
    return (per_token * mask).sum() / mask.sum()


def test_cispo_equals_verl_and_trl_on_the_same_tensors():
    logprobs, old, adv, mask = _inputs()
    adv, old = torch.where(mask, adv, 0), torch.where(mask, old, 0)
    spec = get_objective("cispo")
    lp = torch.where(mask, logprobs, 0)
    ours_verl, _ = spec.fn(logprobs, old, adv, mask, loss_normalizer=5.0, aggregation="token_mean", clip_low=0.2, clip_high=0.28)
    _close(ours_verl, (_verl_cispo(lp, old, adv, mask.to(F64), 0.2, 0.28)))
    # TRL: cap 1.3 (epsilon_high), no lower bound = clip_low null, clip_high 0.3; 1.5 is capped.
    ours_trl, _ = spec.fn(logprobs, old, adv, mask, loss_normalizer=5.0, aggregation="token_mean", clip_low=None, clip_high=0.3)
    _close(ours_trl, (_trl_cispo(lp, old, adv, mask.to(F64), 1.3)))


# ---------------------------------------------------------------------------------------------
# GPG


def test_gpg_by_hand():
    loss, grad, metrics = _run("gpg")
    # per token -A * log p, token mean over 5 tokens:
    expected = -(1 * LN(0.6) - 1 * LN(0.2) - 2 * LN(0.55) + 2 * LN(0.35) + 0.5 * LN(0.9)) / 5
    _close(loss, expected)
    # d/dlog p = -A / 5: -0.2, 0.2, 0.4, -0.4, -0.1 (no ratio, nothing clipped)
    torch.testing.assert_close(grad, _grad([[-0.2, 0.2, 0.0], [0.4, -0.4, -0.1]]), atol=1e-12, rtol=0)
    _close(metrics["clip_frac_high"], 0.0)


# ---------------------------------------------------------------------------------------------
# SAPO


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_sapo_gate_by_hand():
    loss, grad, metrics = _run("sapo")
    # f(r) = sigmoid(tau (r - 1)) * 4 / tau; tau = 1.0 for A > 0, 1.05 for A <= 0. Loss -f(r) * A.
    f00 = _sigmoid(1.0 * 0.5) * 4 / 1.0  # A +1, r 1.5
    f01 = _sigmoid(1.05 * -0.5) * 4 / 1.05  # A -1, r 0.5
    f10 = _sigmoid(1.05 * 0.1) * 4 / 1.05  # A -2, r 1.1
    f11 = _sigmoid(1.0 * -0.3) * 4 / 1.0  # A +2, r 0.7
    f12 = _sigmoid(0.0) * 4 / 1.0  # A +0.5, r 1.0: f = 2
    row0 = (-f00 + f01) / 2
    row1 = (2 * f10 - 2 * f11 - 0.5 * f12) / 3
    _close(loss, (row0 + row1) / 2)  # seq_mean_token_mean

    # d/dlog p = -A * f'(r) * r, f'(r) = 4 s (1 - s) with s = sigmoid(tau (r - 1)); then /len /2.
    def slope(tau, r):
        s = _sigmoid(tau * (r - 1))
        return 4 * s * (1 - s)

    expected = [
        [-1 * slope(1.0, 1.5) * 1.5 / 4, 1 * slope(1.05, 0.5) * 0.5 / 4, 0.0],
        [2 * slope(1.05, 1.1) * 1.1 / 6, -2 * slope(1.0, 0.7) * 0.7 / 6, -0.5 * slope(1.0, 1.0) * 1.0 / 6],
    ]
    torch.testing.assert_close(grad, _grad(expected), atol=1e-12, rtol=0)
    # On-policy the gate's slope is exactly 1: SAPO's gradient equals PPO's there.
    assert slope(1.0, 1.0) == 1.0
    weights = [slope(1.0, 1.5), slope(1.05, 0.5), slope(1.05, 1.1), slope(1.0, 0.7), slope(1.0, 1.0)]
    _close(metrics["sapo/gradient_weight_mean"], sum(weights) / 5)


def _trl_sapo(logprobs, old, adv, mask, tau_pos, tau_neg):
    """TRL GRPOTrainer loss_type 'sapo' (and verl's 'sapo'), written out: per-sequence token mean, then mean."""
    ratio = torch.exp(logprobs - old)
    tau = torch.where(adv > 0, torch.tensor(tau_pos, dtype=F64), torch.tensor(tau_neg, dtype=F64))
    per_token = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def test_sapo_equals_trl_and_verl_on_the_same_tensors():
    logprobs, old, adv, mask = _inputs()
    spec = get_objective("sapo")
    ours, _ = spec.fn(logprobs, old, adv, mask, loss_normalizer=2.0, aggregation="seq_mean_token_mean",
                      temperature_pos=1.0, temperature_neg=1.05)  # fmt: skip
    lp, o, a = (torch.where(mask, t, 0) for t in (logprobs, old, adv))
    _close(ours, (_trl_sapo(lp, o, a, mask.to(F64), 1.0, 1.05)))


# ---------------------------------------------------------------------------------------------
# GMPO


def test_gmpo_by_hand():
    loss, grad, metrics = _run("gmpo", advantages=SEQUENCE_ADV)
    # Log-ratios: row 0 (A +1): ln 1.5 = 0.405, ln 0.5 = -0.693; for A > 0 only the upper side is
    # clipped, at 0.4: [0.4, ln 0.5]. Row 1 (A -1): ln 1.1, ln 0.7 = -0.357, 0; for A < 0 only the
    # lower side, at -0.4: nothing clipped.
    ratio0 = math.exp((0.4 + LN(0.5)) / 2)
    ratio1 = math.exp((LN(1.1) + LN(0.7) + 0.0) / 3)  # (1.1 * 0.7)^(1/3)
    # Sequence loss -A * ratio, mean over the 2 sequences.
    _close(loss, (-1 * ratio0 + 1 * ratio1) / 2)
    # d/dl_t of -A exp(mean l) = -A ratio / len per unclipped token, then / 2 sequences;
    # the clipped token (0,0) gets none.
    expected = [[0.0, -ratio0 / 4, 0.0], [ratio1 / 6, ratio1 / 6, ratio1 / 6]]
    torch.testing.assert_close(grad, _grad(expected), atol=1e-12, rtol=0)
    _close(metrics["clip_frac_high"], 1 / 5)  # (0,0): A > 0, r 1.5 > e^0.4 = 1.49
    _close(metrics["clip_frac_low"], 0.0)  # row 1's smallest ratio 0.7 > e^-0.4 = 0.67
    _close(metrics["gmpo/seq_ratio_mean"], (2 * ratio0 + 3 * ratio1) / 5)


def _verl_geo_mean(logprobs, old, adv, mask, low, high):
    """verl core_algos.compute_policy_loss_geo_mean, written out (mean over the rows)."""
    log_ratio = logprobs - old
    sign = torch.sign(adv)
    clamped = torch.clamp(log_ratio, -low, high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = mask.sum(-1)
    ratio = torch.exp((pessimistic * mask).sum(-1) / (lengths + 1e-8))
    seq_adv = (adv * mask).sum(-1) / (lengths + 1e-8)
    return torch.mean(-seq_adv * ratio)


def test_gmpo_equals_verl_geo_mean_on_the_same_tensors():
    logprobs, old, adv, mask = _inputs(SEQUENCE_ADV)
    spec = get_objective("gmpo")
    ours, _ = spec.fn(
        logprobs, old, adv, mask, loss_normalizer=2.0, aggregation="seq_mean_token_mean", clip_low=0.2, clip_high=0.2
    )
    lp, o, a = (torch.where(mask, t, 0) for t in (logprobs, old, adv))
    # verl's +1e-8 in the denominators moves the value by ~1e-9.
    assert float(ours.detach()) == pytest.approx(float(_verl_geo_mean(lp.detach(), o, a, mask.to(F64), 0.2, 0.2)), abs=1e-8)


# ---------------------------------------------------------------------------------------------
# KL-Cov and Clip-Cov
#
# cov_t = (A_t - mean A)(log p_t - mean log p) over the 5 response tokens:
#   mean A = (1 - 1 - 2 + 2 + 0.5) / 5 = 0.1
#   mean log p = (ln .6 + ln .2 + ln .55 + ln .35 + ln .9) / 5 = -0.774657
#   (0,0)  0.9 * ( -0.510826 + 0.774657) =  0.237448
#   (0,1) -1.1 * ( -1.609438 + 0.774657) =  0.918259
#   (1,0) -2.1 * ( -0.597837 + 0.774657) = -0.371321
#   (1,1)  1.9 * ( -1.049822 + 0.774657) = -0.522814
#   (1,2)  0.4 * ( -0.105361 + 0.774657) =  0.267718


def test_token_covariance_by_hand():
    from polyrl.algos.objectives import token_covariance

    logprobs, _, adv, mask = _inputs()
    cov = token_covariance(logprobs, adv, mask)
    mean_lp = (LN(0.6) + LN(0.2) + LN(0.55) + LN(0.35) + LN(0.9)) / 5
    expected = [[0.9 * (LN(0.6) - mean_lp), -1.1 * (LN(0.2) - mean_lp), 0.0],
                [-2.1 * (LN(0.55) - mean_lp), 1.9 * (LN(0.35) - mean_lp), 0.4 * (LN(0.9) - mean_lp)]]  # fmt: skip
    torch.testing.assert_close(cov, _grad(expected), atol=1e-12, rtol=0)


def test_kl_cov_by_hand():
    loss, grad, metrics = _run("kl_cov", kl_cov_ratio=0.4)
    # k = int(5 * 0.4) = 2: the two largest covariances, (0,1) 0.918 and (1,2) 0.268.
    # Per token -r * A (no clip): -1.5, +0.5, +2.2, -1.4, -0.5 (sum -0.7), plus |log r| on the
    # selected: |ln 0.5| on (0,1), |ln 1| = 0 on (1,2).
    _close(loss, (-0.7 + LN(2.0)) / 5)
    # d/dlog p: -A r / 5, plus sign(log r) / 5 on (0,1) (log r < 0: -1/5); torch's sign(0) = 0 on (1,2).
    torch.testing.assert_close(grad, _grad([[-0.3, 0.1 - 0.2, 0.0], [0.44, -0.28, -0.1]]), atol=1e-12, rtol=0)
    _close(metrics["cov/selected_frac"], 2 / 5)


def test_kl_cov_selects_at_most_k_tokens_when_covariances_tie():
    # Every advantage equal: A - mean A = 0, so every covariance is 0; nothing drives the entropy
    # and no token is selected (a ">= k-th value" rule would select all five).
    loss, grad, metrics = _run("kl_cov", advantages=[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], kl_cov_ratio=0.4)
    _close(metrics["cov/selected_frac"], 0.0)
    # plain -r * A, token mean: -(1.5 + 0.5 + 1.1 + 0.7 + 1.0) / 5
    _close(loss, -4.8 / 5)


def _verl_kl_cov(logprobs, old, adv, mask, ratio_share, coef):
    """verl core_algos.compute_policy_loss_kl_cov with token-mean, written out."""
    log_ratio = logprobs - old
    losses = -adv * torch.exp(log_ratio)
    with_kl = losses + coef * log_ratio.abs()
    valid = mask.bool()
    flat = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    a, lp = adv[valid].detach(), logprobs[valid].detach()
    cov = (a - a.mean()) * (lp - lp.mean())
    top = flat[torch.topk(cov, max(1, int(len(cov) * ratio_share))).indices]
    losses = losses.reshape(-1).clone()
    losses[top] = with_kl.reshape(-1)[top]
    return (losses.reshape(mask.shape) * mask).sum() / mask.sum()


def test_kl_cov_equals_verl_on_the_same_tensors():
    logprobs, old, adv, mask = _inputs()
    lp, o, a = (torch.where(mask, t, 0) for t in (logprobs, old, adv))
    for share in (0.2, 0.4, 0.6):
        ours, _ = get_objective("kl_cov").fn(logprobs, old, adv, mask, loss_normalizer=5.0, aggregation="token_mean",
                                             kl_cov_ratio=share, cov_kl_coef=0.7)  # fmt: skip
        _close(ours, (_verl_kl_cov(lp, o, a, mask.to(F64), share, 0.7)))


def test_clip_cov_by_hand_when_every_candidate_is_picked():
    # Band (0.1, 5): covariances 0.237 (0,0), 0.918 (0,1), 0.268 (1,2) lie in it, but PPO's clip
    # already cut (0,0) (A>0, r 1.5 > 1.2) and (0,1) (A<0, r 0.5 < 0.8): one candidate, (1,2).
    # Wanted max(int(2e-4 * 5), 1) = 1 >= 1 candidate: it is picked for sure, its loss zeroed.
    loss, grad, metrics = _run("clip_cov", clip_cov_lb=0.1)
    # PPO per token: -1.2, 0.8, 2.2, -1.4, [-0.5 -> 0]; token mean: 0.4 / 5
    _close(loss, 0.4 / 5)
    # -A r / 5 on the unclipped, unpicked tokens (1,0), (1,1); 0 elsewhere
    torch.testing.assert_close(grad, _grad([[0.0, 0.0, 0.0], [0.44, -0.28, 0.0]]), atol=1e-12, rtol=0)
    _close(metrics["cov/selected_frac"], 1 / 5)
    _close(metrics["cov/candidate_frac"], 1 / 5)


def _verl_clip_cov(logprobs, old, adv, mask, low, high, ratio_share, lb, ub):
    """verl core_algos.compute_policy_loss_clip_cov with token-mean, written out (random pick of
    min(clip_num, candidates) tokens; deterministic when every candidate is picked)."""
    ratio = torch.exp(logprobs - old)
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high)
    clipped = (l2 > l1) & mask.bool()
    mean_a, mean_lp = (adv * mask).sum() / mask.sum(), (logprobs.detach() * mask).sum() / mask.sum()
    cov = (adv - mean_a) * (logprobs - mean_lp)
    cov[~mask.bool()] = -torch.inf
    cov[clipped] = -torch.inf
    clip_num = max(int(ratio_share * mask.sum().item()), 1)
    idx = torch.nonzero((cov < ub) & (cov > lb) & mask.bool())
    assert len(idx) <= clip_num, "this reference is only deterministic when every candidate is picked"
    corr = torch.ones_like(adv)
    corr[idx[:, 0], idx[:, 1]] = 0
    return ((torch.maximum(l1, l2) * corr) * mask).sum() / mask.sum()


def test_clip_cov_equals_verl_when_every_candidate_is_picked():
    logprobs, old, adv, mask = _inputs()
    lp, o, a = (torch.where(mask, t, 0) for t in (logprobs, old, adv))
    for lb, share in ((0.1, 2e-4), (-1.0, 0.6)):  # 1 candidate / want 1; 3 candidates / want 3
        ours, metrics = get_objective("clip_cov").fn(
            logprobs, old, adv, mask, loss_normalizer=5.0, aggregation="token_mean",
            clip_low=0.2, clip_high=0.2, clip_cov_ratio=share, clip_cov_lb=lb, clip_cov_ub=5.0,
        )  # fmt: skip
        reference = _verl_clip_cov(lp, o, a, mask.to(F64), 0.2, 0.2, share, lb, 5.0)
        _close(ours, reference)


def _big_batch(seed=0, rows=16, width=32):
    generator = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(rows, width, generator=generator, dtype=F64) * 3
    old = logprobs + 0.05 * torch.randn(rows, width, generator=generator, dtype=F64)
    adv = torch.randn(rows, generator=generator, dtype=F64)[:, None].expand(rows, width).clone()
    lengths = torch.randint(4, width + 1, (rows,), generator=generator)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    return logprobs, old, adv, mask


def test_clip_cov_random_pick_is_seeded_and_picks_about_the_wanted_share():
    logprobs, old, adv, mask = _big_batch()
    spec = get_objective("clip_cov")
    params = {**spec.default_params, "clip_cov_ratio": 0.05, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0}

    def selected(seed):
        _, metrics = spec.fn(logprobs, old, adv, mask, loss_normalizer=1.0, aggregation="token_mean", **{**params, "seed": seed})
        return metrics["cov/selected_frac"], metrics["cov/candidate_frac"]

    first, candidates = selected(0)
    assert selected(0) == (first, candidates)  # same seed, same pick
    assert candidates > 0.5  # nearly every token is a candidate in the wide band
    # Each candidate is picked with probability (wanted / candidates), wanted = int(0.05 * tokens):
    # the picked share is 0.05 in expectation; over ~300 tokens its std is ~0.013.
    picks = [selected(seed)[0] for seed in range(20)]
    assert sum(picks) / len(picks) == pytest.approx(0.05, abs=0.01)
    assert len(set(picks)) > 1  # the seed changes the pick


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_covariance_selection_does_not_depend_on_the_micro_batch_split(name):
    # prepare over the whole mini-batch, then each row alone: the row losses add up to the
    # whole batch's loss (KL-Cov's top-k and Clip-Cov's probabilities are the mini-batch's).
    logprobs, old, adv, mask = _big_batch(1, rows=6, width=10)
    spec = get_objective(name)
    params = {**spec.default_params}
    # Clip-Cov: wanting every token makes the pick certain (probability 1), so the split can only
    # matter through the covariance means, which must be the mini-batch's.
    params.update({"kl_cov_ratio": 0.1} if name == "kl_cov" else {"clip_cov_ratio": 1.0, "clip_cov_lb": 0.01})
    prepared = spec.prepare(logprobs, old, adv, mask, **params)
    normalizer = global_loss_normalizer(mask, mode="token_mean")
    whole, metrics = spec.fn(logprobs, old, adv, mask, loss_normalizer=normalizer, aggregation="token_mean", **params, **prepared)
    parts = sum(
        float(spec.fn(logprobs[r : r + 1], old[r : r + 1], adv[r : r + 1], mask[r : r + 1], loss_normalizer=normalizer,
                      aggregation="token_mean", **params, **prepared)[0])
        for r in range(6)
    )  # fmt: skip
    assert 0 < metrics["cov/selected_frac"] < 1
    assert parts == pytest.approx(float(whole.detach()), abs=1e-12, rel=0)
    # Without the mini-batch's prepared values each row would centre on its own means and pick others.
    alone = sum(
        float(spec.fn(logprobs[r : r + 1], old[r : r + 1], adv[r : r + 1], mask[r : r + 1], loss_normalizer=normalizer,
                      aggregation="token_mean", **params)[0])
        for r in range(6)
    )  # fmt: skip
    assert abs(alone - parts) > 1e-6


# ---------------------------------------------------------------------------------------------
# PPO-clip registrations named for their estimator


@pytest.mark.parametrize(
    ("name", "advantage", "aggregation"),
    [
        ("rloo", "rloo", "seq_mean_token_sum"),
        ("reinforce_pp", "reinforce_pp", "token_mean"),
        ("reinforce_pp_baseline", "reinforce_pp_baseline", "token_mean"),
        ("remax", "remax", "seq_mean_token_mean"),
    ],
)
def test_estimator_named_objectives_are_ppo_clip_with_their_estimator(name, advantage, aggregation):
    spec = get_objective(name)
    assert spec.default_advantage == advantage and get_advantage(advantage).name == advantage
    assert spec.default_aggregation == aggregation
    ours = _run(name)
    ppo = _run("ppo", aggregation=aggregation)
    assert ours[0] == ppo[0] and torch.equal(ours[1], ppo[1])


def test_rloo_by_hand():
    loss, _, _ = _run("rloo")
    # seq_mean_token_sum of PPO's per-token losses: row 0 -1.2 + 0.8 = -0.4; row 1 2.2 - 1.4 - 0.5 = 0.3
    _close(loss, (-0.4 + 0.3) / 2)


# ---------------------------------------------------------------------------------------------
# Invariances shared by every new objective


def _dirty(tensor, garbage):
    return torch.where(MASK, tensor, torch.full_like(tensor, garbage))


@pytest.mark.parametrize("aggregation", AGGREGATION_MODES)
@pytest.mark.parametrize("name", NEW_OBJECTIVES)
def test_garbage_under_mask_changes_neither_loss_nor_gradients(name, aggregation):
    spec = get_objective(name)
    clean_logprobs, old_logprobs, advantages, mask = _inputs()
    ref_logprobs = old_logprobs - 0.1
    entropy = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.5, 1.0]], dtype=F64)
    params = {**spec.default_params, "kl_coef": 0.1, "entropy_coef": 0.01}
    if name == "clip_cov":
        params["clip_cov_lb"] = -1.0  # three candidates: the random pick is part of what must not change
    normalizer = global_loss_normalizer(mask, mode=aggregation)

    def run(logprobs, old, adv, ref, ent):
        loss, metrics = spec.fn(logprobs, old, adv, mask, loss_normalizer=normalizer, aggregation=aggregation,
                                entropy=ent, **{**params, "ref_logprobs": ref})  # fmt: skip
        loss.backward()
        return loss.detach(), metrics

    clean_loss, clean_metrics = run(clean_logprobs, old_logprobs, advantages, ref_logprobs, entropy)
    dirty_logprobs = _dirty(clean_logprobs.detach(), NAN).requires_grad_(True)
    dirty_loss, dirty_metrics = run(dirty_logprobs, _dirty(old_logprobs, -math.inf), _dirty(advantages, NAN),
                                    _dirty(ref_logprobs, 1e30), _dirty(entropy, NAN))  # fmt: skip
    assert torch.isfinite(clean_loss)
    assert torch.equal(clean_loss, dirty_loss)
    assert torch.isfinite(dirty_logprobs.grad).all()
    assert torch.equal(clean_logprobs.grad, dirty_logprobs.grad)
    assert clean_metrics == dirty_metrics


@pytest.mark.parametrize("name", NEW_OBJECTIVES)
def test_huge_log_ratio_keeps_loss_and_gradients_finite(name):
    spec = get_objective(name)
    logprobs = torch.tensor([[-0.5, -1.0], [-0.7, -0.2]], dtype=torch.float32, requires_grad=True)
    old_logprobs = logprobs.detach() - torch.tensor([[100.0, 100.0], [0.0, 0.1]])
    advantages = torch.full((2, 2), -1.0)
    mask = torch.ones(2, 2, dtype=torch.bool)
    aggregation = spec.default_aggregation
    loss, metrics = spec.fn(logprobs, old_logprobs, advantages, mask, aggregation=aggregation,
                            loss_normalizer=global_loss_normalizer(mask, mode=aggregation), **spec.default_params)  # fmt: skip
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logprobs.grad).all()
    assert all(math.isfinite(value) for value in metrics.values())


@pytest.mark.parametrize("name", NEW_OBJECTIVES)
def test_every_new_objective_is_documented(name):
    spec = get_objective(name)
    assert "arXiv" in spec.paper and spec.description and spec.deviations
    assert spec.fn.__doc__ and "arXiv" in spec.fn.__doc__
