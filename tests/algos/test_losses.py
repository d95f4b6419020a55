import math

import pytest
import torch

from polyrl.algos.aggregation import global_loss_normalizer
from polyrl.algos.losses import clipped_value_loss, entropy_from_logits, kl_in_reward, kl_penalty

F64 = torch.float64
LN2 = math.log(2.0)


def _kl(estimator: str) -> float:
    # p = 0.5 under the policy, 0.25 under the reference: log p - log ref = ln 2
    logprobs = torch.tensor([math.log(0.5)], dtype=F64)
    ref = torch.tensor([math.log(0.25)], dtype=F64)
    return float(kl_penalty(logprobs, ref, estimator=estimator))


def test_kl_estimators_by_hand():
    assert _kl("k1") == pytest.approx(LN2, abs=1e-12, rel=0)  # ln 2 = 0.693147
    assert _kl("k2") == pytest.approx(0.5 * LN2**2, abs=1e-12, rel=0)  # 0.5 * ln^2 2 = 0.240227
    # log_ratio = ln(0.25 / 0.5) = -ln 2; exp(-ln 2) - (-ln 2) - 1 = 0.5 + ln 2 - 1 = 0.193147
    assert _kl("k3") == pytest.approx(0.5 + LN2 - 1.0, abs=1e-12, rel=0)


def test_kl_estimators_vanish_when_policies_agree_and_reject_unknown_names():
    same = torch.tensor([-1.3, -0.2], dtype=F64)
    for estimator in ("k1", "k2", "k3"):
        assert torch.equal(kl_penalty(same, same, estimator=estimator), torch.zeros(2, dtype=F64))
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(same, same, estimator="k4")


def test_kl_in_reward_by_hand_and_masked():
    rewards = torch.tensor([[0.0, 1.0, math.nan]], dtype=F64)
    logprobs = torch.tensor([[math.log(0.5), math.log(0.5), math.nan]], dtype=F64)
    ref = torch.tensor([[math.log(0.25), math.log(0.5), -math.inf]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    shaped, metrics = kl_in_reward(rewards, logprobs, ref, mask, kl_coef=0.1, estimator="k1")
    # token 0: 0 - 0.1 * ln 2; token 1: 1 - 0.1 * 0; masked token: 0
    expected = torch.tensor([[-0.1 * LN2, 1.0, 0.0]], dtype=F64)
    torch.testing.assert_close(shaped, expected, atol=1e-12, rtol=0)
    assert metrics["kl_reward/kl_mean"] == pytest.approx(LN2 / 2, abs=1e-12, rel=0)


def test_entropy_from_logits_by_hand():
    # uniform over 4 outcomes: ln 4; shifted by 1000 it must not overflow
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1000.0, 1000.0, 1000.0, 1000.0]], dtype=F64)
    torch.testing.assert_close(entropy_from_logits(logits), torch.full((2,), math.log(4), dtype=F64), atol=1e-12, rtol=0)


def test_entropy_from_logits_with_minus_inf_logits_has_finite_value_and_gradient():
    # two live outcomes of equal logit: ln 2
    logits = torch.tensor([0.0, -math.inf, 0.0], dtype=F64, requires_grad=True)
    entropy = entropy_from_logits(logits)
    entropy.backward()
    assert float(entropy.detach()) == pytest.approx(LN2, abs=1e-12, rel=0)
    assert torch.isfinite(logits.grad).all()


def test_entropy_from_logits_matches_the_definition():
    torch.manual_seed(0)
    logits = torch.randn(5, 7, dtype=F64) * 3
    probs = torch.softmax(logits, dim=-1)
    reference = -(probs * probs.log()).sum(dim=-1)
    torch.testing.assert_close(entropy_from_logits(logits), reference, atol=1e-12, rtol=0)


def test_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 2.0, math.nan]], dtype=F64, requires_grad=True)
    old_values = torch.tensor([[0.5, 2.0, math.inf]], dtype=F64)
    returns = torch.tensor([[2.0, 1.0, -math.inf]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    normalizer = global_loss_normalizer(mask, mode="token_mean")  # 2 tokens
    loss, metrics = clipped_value_loss(
        values, old_values, returns, mask, clip_range=0.2, loss_normalizer=normalizer, aggregation="token_mean"
    )
    loss.backward()
    # token 0: V_clip = 0.5 + clamp(0.5, -0.2, 0.2) = 0.7; max((1-2)^2, (0.7-2)^2) = 1.69 -> 0.845
    # token 1: V = V_old = 2; (2-1)^2 = 1 -> 0.5;  mean (0.845 + 0.5) / 2 = 0.6725
    assert loss.item() == pytest.approx(0.6725, abs=1e-12, rel=0)
    # token 0's clipped branch wins and is flat in V; token 1: (V - R) / 2 tokens = 0.5
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.5, 0.0]], dtype=F64), atol=1e-12, rtol=0)
    assert metrics["value/clip_frac"] == pytest.approx(0.5, abs=1e-12, rel=0)
