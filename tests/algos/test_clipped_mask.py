"""The objectives' per-token detail for the rollout inspector (``inspect_tokens=True``): the clip's
mask by hand, its share equal to the logged clip fractions, and nothing else changed."""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.algos.objectives import clip_removed_mask, get_objective, list_objectives


def _call(name: str, logprobs, old, advantages, mask, **extra):
    spec = get_objective(name)
    params = {**spec.default_params, **extra}
    prepared = {}
    if spec.prepare is not None:
        prepared = dict(spec.prepare(logprobs, old, advantages, mask, entropy=None, **params))
    return spec.fn(logprobs, old, advantages, mask, loss_normalizer=float(mask.sum()), aggregation="token_mean",
                   **params, **prepared)  # fmt: skip


def test_ppo_clip_mask_by_hand():
    # Ratios r = exp(logprobs - old): 0.5, 0.9, 1.1, 1.5 with advantages +1, -1, -1, +1, and a
    # masked fifth token (r = 3, A = +1). PPO's bounds at clip 0.2: [0.8, 1.2].
    # token 0: A>0, r=0.5 <= 1.2: the term r*A is the min, not clipped.
    # token 1: A<0, r=0.9 >= 0.8: not clipped.
    # token 2: A<0, r=1.1 >= 0.8: r*A = -1.1 < clip(r)*A = -1.1 (equal; in range): not clipped.
    # token 3: A>0, r=1.5 > 1.2: min(1.5, 1.2) = 1.2 is the clipped term, constant in θ: clipped.
    # token 4: masked: never clipped.
    # Shares over the 4 unmasked tokens: clip_frac_high = 1/4, clip_frac_low = 0.
    ratios = torch.tensor([[0.5, 0.9, 1.1, 1.5, 3.0]])
    old = torch.zeros_like(ratios)
    advantages = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    loss, metrics = _call("ppo", ratios.log(), old, advantages, mask, inspect_tokens=True)
    assert metrics["tokens/clipped"].tolist() == [[False, False, False, True, False]]
    assert torch.allclose(metrics["tokens/ratio"][mask], ratios[mask])
    assert metrics["clip_frac_high"] == pytest.approx(0.25) and metrics["clip_frac_low"] == 0.0
    # A<0 below the lower bound: r = 0.5 with A = -1 has the per-token losses -r*A = 0.5 and
    # -clip(r)*A = 0.8; the loss is their max, 0.8, the clipped term: clipped. r = 0.5 with A = 0: not.
    low = clip_removed_mask(torch.tensor([0.5, 0.5]), torch.tensor([-1.0, 0.0]), torch.tensor([True, True]),
                            low_bound=0.8, high_bound=1.2)  # fmt: skip
    assert low.tolist() == [True, False]
    # Without inspect_tokens: the same loss and float metrics, no tensors.
    plain_loss, plain = _call("ppo", ratios.log(), old, advantages, mask)
    assert torch.equal(plain_loss, loss) and plain == {k: v for k, v in metrics.items() if not k.startswith("tokens/")}


def test_dual_clip_tokens_are_clipped_too():
    # dual_clip c = 3: a token with A = -1 and r = 4 > 3 has its loss capped at c*|A| = 3 (constant
    # in θ): clipped, as dual_clip_frac counts it (1 of 2 tokens); r = 2 < 3 keeps its gradient.
    ratios = torch.tensor([[4.0, 2.0]])
    advantages = torch.tensor([[-1.0, -1.0]])
    mask = torch.ones_like(ratios, dtype=torch.bool)
    _, metrics = _call("ppo", ratios.log(), torch.zeros_like(ratios), advantages, mask, dual_clip=3.0, inspect_tokens=True)
    assert metrics["tokens/clipped"].tolist() == [[True, False]]
    assert metrics["dual_clip_frac"] == pytest.approx(0.5)


def test_objectives_without_a_clip_say_na():
    # CISPO, GPG, SAPO and KL-Cov pass the bounds (0, inf) to the common metrics: no clip, no mask.
    assert clip_removed_mask(torch.ones(2), torch.ones(2), torch.ones(2, dtype=torch.bool), low_bound=0.0,
                             high_bound=math.inf) is None  # fmt: skip


@pytest.mark.parametrize("name", [spec.name for spec in list_objectives()])
def test_every_objective_the_clipped_share_is_its_logged_clip_fraction(name):
    torch.manual_seed(0)
    logprobs = -torch.rand(4, 6) * 2
    old = logprobs + torch.randn(4, 6) * 0.4  # ratios well outside [0.8, 1.2] for some tokens
    advantages = torch.randn(4, 1).expand(4, 6).contiguous()  # sequence advantages (GSPO takes the row mean)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 4:] = False
    loss, metrics = _call(name, logprobs, old, advantages, mask, inspect_tokens=True)
    plain_loss, plain = _call(name, logprobs, old, advantages, mask)
    assert torch.equal(loss, plain_loss)
    assert plain == {k: v for k, v in metrics.items() if not k.startswith("tokens/")}
    ratio = metrics["tokens/ratio"]
    assert float(ratio[mask].min()) == pytest.approx(metrics["ratio_min"]) and float(ratio[mask].max()) == pytest.approx(
        metrics["ratio_max"]
    )
    if "tokens/clipped" not in metrics:
        assert name in {"cispo", "gpg", "sapo", "kl_cov"}  # no clip: "n/a"
        return
    share = float(metrics["tokens/clipped"][mask].float().mean())
    logged = metrics["clip_frac_low"] + metrics["clip_frac_high"] + metrics.get("dual_clip_frac", 0.0)
    logged += metrics.get("cov/selected_frac", 0.0)
    assert share == pytest.approx(logged, abs=1e-6)
    assert not metrics["tokens/clipped"][~mask].any()
