"""Building blocks shared by the objectives: KL estimators, entropy, clipped value loss."""

from __future__ import annotations

import torch
from torch import Tensor

from polyrl.algos.aggregation import aggregate

KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")


def zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` with masked positions replaced by 0, so NaN/inf there reach neither exp nor grads."""
    return torch.where(mask.bool(), x, torch.zeros_like(x))


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    mask = mask.bool()
    return zero_masked(x, mask).sum() / mask.sum().clamp(min=1)


def masked_mean_std(x: Tensor, mask: Tensor, *, unbiased: bool = False) -> tuple[Tensor, Tensor]:
    """Mean and std of ``x`` over ``mask`` (population std, or Bessel-corrected with
    ``unbiased``); std 0 for fewer than two positions, mean 0 for none."""
    mask = mask.bool()
    mean = masked_mean(x, mask)
    count = mask.sum()
    variance = zero_masked((x - mean).square(), mask).sum() / ((count - 1) if unbiased else count).clamp(min=1)
    return mean, variance.sqrt()


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, *, estimator: str) -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta.

    From J. Schulman, "Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html),
    with ``log_ratio = logref - logp``:

    - ``k1 = logp - logref``: unbiased, high variance, can be negative per token.
    - ``k2 = 0.5 * (logp - logref)**2``: biased, low variance, always >= 0.
    - ``k3 = exp(log_ratio) - log_ratio - 1``: unbiased, low variance, always >= 0 (GRPO's choice).

    The caller must zero masked positions first (see :func:`zero_masked`); no clamping is
    applied, which is a deviation from some libraries that clamp k3 to [-10, 10].
    """
    log_ratio = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; allowed: {', '.join(KL_ESTIMATORS)}")


def kl_in_reward(
    token_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    *,
    kl_coef: float,
    estimator: str = "k1",
) -> tuple[Tensor, dict[str, float]]:
    """Fold a KL penalty into token rewards: ``r_t - kl_coef * k(t)`` on response tokens.

    This is the InstructGPT/PPO-RLHF placement of the KL term (Ouyang et al. 2022,
    arXiv 2203.02155); the alternative, a KL term in the loss, is the objectives' ``kl_coef``.
    Masked positions of the result are 0.
    """
    mask = mask.bool()
    with torch.no_grad():
        kl = kl_penalty(zero_masked(logprobs, mask), zero_masked(ref_logprobs, mask), estimator=estimator)
        shaped = zero_masked(token_rewards, mask) - kl_coef * zero_masked(kl, mask)
        metrics = {"kl_reward/kl_mean": float(masked_mean(kl, mask))}
    return shaped, metrics


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy ``H = logsumexp(z) - sum_i softmax(z)_i * z_i`` over the last dim.

    Stable for large logits (no exp overflow) and for ``-inf`` logits (masked vocabulary
    entries): their ``p * z`` term would be ``0 * -inf = NaN``, so those logits are replaced by 0
    inside the product, which keeps both the value and the gradient finite.
    """
    probs = torch.softmax(logits, dim=-1)
    finite_logits = torch.where(torch.isfinite(logits), logits, torch.zeros_like(logits))
    return torch.logsumexp(logits, dim=-1) - (probs * finite_logits).sum(dim=-1)


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_range: float,
    loss_normalizer: float,
    aggregation: str,
) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped value loss ``0.5 * max((V - R)^2, (V_clip - R)^2)``.

    ``V_clip = V_old + clamp(V - V_old, -clip_range, clip_range)``, as in the OpenAI baselines
    PPO2 implementation (Schulman et al., "Proximal Policy Optimization Algorithms",
    arXiv 1707.06347 does not spell the value clipping out; baselines introduced it).
    """
    mask = mask.bool()
    values = zero_masked(values, mask)
    old_values = zero_masked(old_values, mask)
    returns = zero_masked(returns, mask)
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    unclipped_error = (values - returns).square()
    clipped_error = (clipped_values - returns).square()
    per_token = 0.5 * torch.maximum(unclipped_error, clipped_error)
    loss = aggregate(per_token, mask, mode=aggregation, loss_normalizer=loss_normalizer)
    with torch.no_grad():
        metrics = {
            "value/clip_frac": float(masked_mean((clipped_error > unclipped_error).to(values.dtype), mask)),
            "value/mean": float(masked_mean(values, mask)),
            "value/returns_mean": float(masked_mean(returns, mask)),
            "value/mse": float(masked_mean(unclipped_error, mask)),
        }
    return loss, metrics
