import math

import pytest
import torch

from polyrl.algos.objectives import bapo as bapo_module
from polyrl.algos.objectives import (
    bapo_positive_share,
    bapo_search_clip_bounds,
    entropy_adaptive_epsilon,
    get_objective,
    positive_weight,
)

F64 = torch.float64


def _batch(pairs):
    """One row of (ratio, advantage) tokens plus a masked garbage token."""
    ratio = torch.tensor([[r for r, _ in pairs] + [math.nan]], dtype=F64)
    advantages = torch.tensor([[a for _, a in pairs] + [math.nan]], dtype=F64)
    mask = torch.tensor([[True] * len(pairs) + [False]])
    return ratio, advantages, mask


# Negative-dominated batch whose balance needs both bounds:
#   positives (r, A): (1.0, +1) kept; (1.45, +1) kept only once c_high >= 1.45
#   negatives (r, A=-1): 0.62, 0.67, 0.87, 0.95, 1.05, each dropped once c_low exceeds its ratio
NEEDS_BOTH = [(1.0, 1.0), (1.45, 1.0), (0.62, -1.0), (0.67, -1.0), (0.87, -1.0), (0.95, -1.0), (1.05, -1.0)]
# Balanced by c_low alone: positive (1.0, +1); negatives 0.62, 0.67, 0.95
LOW_SUFFICES = [(1.0, 1.0), (0.62, -1.0), (0.67, -1.0), (0.95, -1.0)]
# Unreachable: the only positive token has ratio 5 > c_high_max = 3
UNREACHABLE = [(5.0, 1.0), (0.95, -1.0), (1.0, -1.0)]


def test_positive_share_by_hand():
    ratio, advantages, mask = _batch(NEEDS_BOTH)
    # [0.6, 1.2]: pos = 1.0 (1.45 > 1.2 excluded); neg = 0.62 + 0.67 + 0.87 + 0.95 + 1.05 = 4.16
    assert bapo_positive_share(ratio, advantages, mask, c_low=0.6, c_high=1.2) == pytest.approx(1.0 / 5.16, abs=1e-12, rel=0)
    # [0.9, 1.5]: pos = 1.0 + 1.45 = 2.45; neg = 0.95 + 1.05 = 2.0
    assert bapo_positive_share(ratio, advantages, mask, c_low=0.9, c_high=1.5) == pytest.approx(2.45 / 4.45, abs=1e-12, rel=0)
    # no negative contribution at all: nothing to balance
    assert bapo_positive_share(ratio, advantages.abs(), mask, c_low=0.6, c_high=1.2) == 1.0


def _record_search(monkeypatch, pairs, **kwargs):
    visited = []
    real_share = bapo_module.bapo_positive_share

    def recording_share(ratio, advantages, mask, *, c_low, c_high):
        visited.append((c_low, c_high))
        return real_share(ratio, advantages, mask, c_low=c_low, c_high=c_high)

    monkeypatch.setattr(bapo_module, "bapo_positive_share", recording_share)
    return bapo_search_clip_bounds(*_batch(pairs), **kwargs), visited


def test_search_raises_c_low_to_its_max_before_touching_c_high(monkeypatch):
    (c_low, c_high, share), visited = _record_search(monkeypatch, NEEDS_BOTH)
    # c_low 0.6 -> 0.65 (drops 0.62) -> 0.70 (drops 0.67) -> ... -> 0.90 (drops 0.87): share 1 / 3
    # then c_high 1.2 -> 1.3 -> 1.4 -> 1.5 (admits 1.45): share 2.45 / 4.45 = 0.5506 >= 0.5
    assert c_low == 0.9
    assert c_high == pytest.approx(1.5, abs=1e-12, rel=0)
    assert share == pytest.approx(2.45 / 4.45, abs=1e-12, rel=0)
    lows = [low for low, _ in visited]
    highs = [high for _, high in visited]
    assert lows == pytest.approx([0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.9, 0.9, 0.9], abs=1e-12)
    assert highs == pytest.approx([1.2] * 7 + [1.3, 1.4, 1.5], abs=1e-12)


def test_search_stops_as_soon_as_the_target_is_reached():
    c_low, c_high, share = bapo_search_clip_bounds(*_batch(LOW_SUFFICES))
    # start: neg 0.62 + 0.67 + 0.95 = 2.24 -> 1 / 3.24; c_low 0.65: 1 / 2.62; c_low 0.70: 1 / 1.95 = 0.513
    assert c_low == pytest.approx(0.7, abs=1e-12, rel=0)
    assert c_high == 1.2
    assert share == pytest.approx(1 / 1.95, abs=1e-12, rel=0)


def test_search_ends_at_both_maxima_when_the_target_is_unreachable():
    c_low, c_high, share = bapo_search_clip_bounds(*_batch(UNREACHABLE))
    # the ratio-5 positive stays excluded and the negatives (0.95, 1.0) stay above c_low_max 0.9
    assert (c_low, c_high) == (0.9, 3.0)
    assert share == 0.0


def test_search_makes_no_step_when_already_balanced():
    assert bapo_search_clip_bounds(*_batch([(1.0, 1.0), (1.0, -1.0)])) == (0.6, 1.2, 0.5)


def _bapo(pairs, **params):
    ratio, advantages, mask = _batch(pairs)
    old_logprobs = torch.full_like(ratio, math.log(0.5))
    logprobs = (old_logprobs + ratio.log()).requires_grad_(True)
    spec = get_objective("bapo")
    entropy = params.pop("entropy", None)
    loss, metrics = spec.fn(
        logprobs, old_logprobs, advantages, mask,
        loss_normalizer=float(mask.sum()), aggregation="token_mean", entropy=entropy,
        **{**spec.default_params, **params},
    )  # fmt: skip
    loss.backward()
    return loss.item(), logprobs.grad, metrics


def test_bapo_loss_by_hand():
    loss, grad, metrics = _bapo(LOW_SUFFICES)
    # the search picks [0.7, 1.2]; per token max(-r*A, -clip(r, 0.7, 1.2)*A):
    #   (1.0, +1): -1;  (0.62, -1): max(0.62, 0.7) = 0.7;  (0.67, -1): 0.7;  (0.95, -1): 0.95
    # token_mean: (-1 + 0.7 + 0.7 + 0.95) / 4 = 0.3375
    assert loss == pytest.approx(0.3375, abs=1e-12, rel=0)
    # gradients -A*r/4 where unclipped: -1/4 and 0.95/4; clipped negatives get none
    expected = torch.tensor([[-0.25, 0.0, 0.0, 0.2375, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)
    assert metrics["bapo/c_low"] == pytest.approx(0.7, abs=1e-12)
    assert metrics["bapo/c_high"] == 1.2
    assert metrics["bapo/positive_share"] == pytest.approx(1 / 1.95, abs=1e-12)
    assert metrics["bapo/search_steps"] == 2.0
    assert metrics["clip_frac_low"] == pytest.approx(2 / 4, abs=1e-12)


def test_bapo_reports_the_search_steps_of_both_bounds():
    _, _, metrics = _bapo(NEEDS_BOTH)
    assert metrics["bapo/search_steps"] == 9.0  # 6 raises of c_low, then 3 of c_high
    _, _, metrics = _bapo(UNREACHABLE)
    assert metrics["bapo/search_steps"] == 6.0 + 18.0
    assert (metrics["bapo/c_low"], metrics["bapo/c_high"]) == (0.9, 3.0)


def test_bapo_with_fixed_bounds_skips_the_search():
    loss, _, metrics = _bapo(LOW_SUFFICES, clip_bounds=(0.6, 1.2))
    # (1.0, +1): -1; 0.62 and 0.67 lie inside [0.6, 1.2]: 0.62 + 0.67; 0.95 -> (-1 + 2.24) / 4 = 0.31
    assert loss == pytest.approx(0.31, abs=1e-12, rel=0)
    assert metrics["bapo/search_steps"] == 0.0
    assert metrics["bapo/positive_share"] == pytest.approx(1 / 3.24, abs=1e-12)


def test_bapo_positive_weight_sigmoid_by_hand():
    share = 1 / 1.95  # positive share at the searched bounds [0.7, 1.2]
    # seed sign: lambda = sigmoid(5 * (0.5128 - 0.45)) = 0.5784
    weight = 1 / (1 + math.exp(-5 * (share - 0.45)))
    loss, _, metrics = _bapo(LOW_SUFFICES, positive_weight_sigmoid=True)
    # positive loss -1 weighted by lambda, negatives 0.7 + 0.7 + 0.95 by 1 - lambda; / 4 tokens
    assert loss == pytest.approx((-weight + 2.35 * (1 - weight)) / 4, abs=1e-12, rel=0)
    assert metrics["bapo/positive_weight"] == pytest.approx(weight, abs=1e-12)
    assert weight > 0.5  # as written, the already-dominant side (share > C_target) gains weight
    _, _, balancing = _bapo(LOW_SUFFICES, positive_weight_sigmoid=True, positive_weight_sign=-1.0)
    assert balancing["bapo/positive_weight"] == pytest.approx(1 - weight, abs=1e-12)


def test_positive_weight_and_entropy_epsilon_formulas():
    assert positive_weight(0.45, target_share=0.45, beta=7.0, sign=1.0) == 0.5
    # eps = 0.2 * (1 + 0.2 * (1.5 - 1.0)) = 0.22
    assert entropy_adaptive_epsilon(1.0, epsilon_base=0.2, alpha=0.2, entropy_target=1.5) == pytest.approx(0.22)
    assert entropy_adaptive_epsilon(100.0, epsilon_base=0.2, alpha=0.2, entropy_target=1.5) == 0.0


def test_bapo_entropy_adaptive_clip_sets_the_bounds():
    entropy = torch.tensor([[1.0, 1.0, 1.0, 1.0, math.nan]], dtype=F64)
    _, _, metrics = _bapo(LOW_SUFFICES, entropy=entropy, entropy_adaptive_clip=True, bound_search=False)
    # mean entropy 1.0, target 1.5, alpha 0.2, base 0.2: eps = 0.22 -> bounds [0.78, 1.22]
    assert metrics["bapo/clip_eps"] == pytest.approx(0.22, abs=1e-12)
    assert metrics["bapo/c_low"] == pytest.approx(0.78, abs=1e-12)
    assert metrics["bapo/c_high"] == pytest.approx(1.22, abs=1e-12)
    with pytest.raises(ValueError, match="entropy"):
        _bapo(LOW_SUFFICES, entropy_adaptive_clip=True)


def test_search_rejects_non_positive_steps():
    with pytest.raises(ValueError, match="step"):
        bapo_search_clip_bounds(*_batch(LOW_SUFFICES), c_low_step=0.0)


# ---------------------------------------------------------------------------------------------
# Batch-level preparation: one bound search per mini-batch, shared by its micro-batches


def test_prepare_returns_the_batch_level_choices_by_hand():
    ratio, advantages, mask = _batch(LOW_SUFFICES)
    old_logprobs = torch.full_like(ratio, math.log(0.5))
    spec = get_objective("bapo")
    state = spec.prepare(old_logprobs + ratio.log(), old_logprobs, advantages, mask, entropy=None, **spec.default_params)
    # as in test_bapo_loss_by_hand: the search stops at [0.7, 1.2] after 2 raises, share 1 / 1.95
    assert state["clip_bounds"] == pytest.approx((0.7, 1.2), abs=1e-12)
    assert state["positive_share"] == pytest.approx(1 / 1.95, abs=1e-12)
    assert state["search_steps"] == 2
    assert "clip_eps" not in state
    assert all(get_objective(name).prepare is None for name in ("ppo", "grpo", "dr_grpo", "dapo", "gspo", "gspo_token"))


def _split_batch():
    """4 rows of 3 tokens: row 0 positive and rising, rows 1-3 negative, one row with low ratios.
    Alone, the first row has no negative contribution and the others no positive one, so a
    per-row search picks other bounds than a search over the whole batch."""
    ratios = torch.tensor([[1.0, 1.3, 1.1], [0.62, 0.9, 1.0], [0.66, 0.95, 1.05], [1.0, 0.7, 0.8]], dtype=F64)
    advantages = torch.tensor([[1.0] * 3, [-1.0] * 3, [-0.5] * 3, [-0.25] * 3], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    entropy = torch.tensor([[1.0, 0.5, 0.2], [1.2, 0.8, 0.0], [0.3, 0.4, 0.5], [2.0, 0.0, 0.0]], dtype=F64)
    old_logprobs = torch.full_like(ratios, math.log(0.25))
    return old_logprobs + ratios.log(), old_logprobs, advantages, mask, entropy


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_sum_constant_norm"])
@pytest.mark.parametrize(
    "params",
    [{}, {"positive_weight_sigmoid": True, "positive_weight_sign": -1.0}, {"entropy_adaptive_clip": True, "dual_clip": 3.0}],
)
def test_bapo_loss_is_split_invariant_with_prepare(aggregation, params):
    from polyrl.algos.aggregation import global_loss_normalizer

    spec = get_objective("bapo")
    logprobs, old_logprobs, advantages, mask, entropy = _split_batch()
    params = {**spec.default_params, **params}
    normalizer = global_loss_normalizer(mask, mode=aggregation, max_response_length=3)
    state = spec.prepare(logprobs, old_logprobs, advantages, mask, entropy=entropy, **params)

    def run(rows, extra):
        current = logprobs[rows].clone().requires_grad_(True)
        loss, metrics = spec.fn(current, old_logprobs[rows], advantages[rows], mask[rows], entropy=entropy[rows],
                                loss_normalizer=normalizer, aggregation=aggregation, **params, **extra)  # fmt: skip
        loss.backward()
        return loss.detach(), current.grad, metrics

    whole_loss, whole_grad, whole_metrics = run(slice(0, 4), state)
    micro = [run(slice(row, row + 1), state) for row in range(4)]
    torch.testing.assert_close(sum(loss for loss, _, _ in micro), whole_loss, atol=1e-12, rtol=0)
    torch.testing.assert_close(torch.cat([grad for _, grad, _ in micro]), whole_grad, atol=1e-12, rtol=0)
    assert whole_grad.abs().max() > 1e-3
    for _, _, metrics in micro:
        assert (metrics["bapo/c_low"], metrics["bapo/c_high"]) == state["clip_bounds"]
        assert metrics["bapo/positive_share"] == state["positive_share"]
    # called alone on the whole batch, bapo_loss makes the same choices as prepare
    alone_loss, _, alone_metrics = run(slice(0, 4), {})
    torch.testing.assert_close(alone_loss, whole_loss, atol=1e-12, rtol=0)
    assert (alone_metrics["bapo/c_low"], alone_metrics["bapo/c_high"]) == state["clip_bounds"]
    # without the shared state each row would search its own bounds: the split would matter
    per_row = {(m["bapo/c_low"], m["bapo/c_high"]) for _, _, m in (run(slice(r, r + 1), {}) for r in range(4))}
    assert per_row != {state["clip_bounds"]}
