"""Pieces every objective shares: ratios, the clipped surrogate, KL/entropy terms, metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from polyrl.algos.aggregation import aggregate, token_weights
from polyrl.algos.losses import kl_penalty, masked_mean, zero_masked
from polyrl.algos.metric_parts import ratio_parts

# exp(20) ~ 4.9e8 is finite in every float dtype; beyond it the log-ratio is clamped (and gets no
# gradient), so a stale or corrupted old log-prob cannot turn the loss into inf/NaN. verl's
# core_algos.compute_policy_loss clamps the log-ratio at the same +-20.
LOG_RATIO_CLAMP = 20.0


def clipped_surrogate_per_token(
    ratio: Tensor, advantages: Tensor, *, low_bound: float, high_bound: float, dual_clip: float | None = None
) -> Tensor:
    """``-min(r*A, clip(r, low, high)*A)`` per token, optionally dual-clipped.

    Dual clip (Ye et al., "Mastering Complex Control in MOBA Games with Deep Reinforcement
    Learning", arXiv 1912.09729): for A<0 the loss is additionally capped at ``-c*A = c*|A|``,
    so a huge ratio on a negative-advantage token cannot produce an unbounded loss.
    """
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, low_bound, high_bound)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is None:
        return loss
    if dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    capped = torch.minimum(loss, -dual_clip * advantages)
    return torch.where(advantages < 0, capped, loss)


def clamped_log_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """``log pi - log pi_old`` per token, clamped to +-LOG_RATIO_CLAMP."""
    return torch.clamp(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def token_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    return torch.exp(clamped_log_ratio(logprobs, old_logprobs))


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Masked mean over tokens of ``log pi - log pi_old`` per row [B] (log of GSPO's s_i),
    clamped to +-LOG_RATIO_CLAMP like the token log-ratio."""
    mask = mask.bool()
    lengths = mask.sum(dim=-1).clamp(min=1)
    mean = zero_masked(logprobs - old_logprobs, mask).sum(dim=-1) / lengths
    return torch.clamp(mean, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def sequence_advantages(advantages: Tensor, mask: Tensor) -> Tensor:
    """Each row's masked mean advantage [B]; equals the broadcast value for sequence advantages."""
    mask = mask.bool()
    lengths = mask.sum(dim=-1).clamp(min=1)
    return zero_masked(advantages, mask).sum(dim=-1) / lengths


def approx_kl_old_to_new(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """Per-token ``(r - 1) - log r`` with ``r = pi_theta / pi_old``: Schulman's k3 estimator of
    KL(pi_old || pi_theta), unbiased and >= 0 for tokens sampled from pi_old, which is what the
    update's tokens are. (``losses.kl_penalty(new, old, "k3")`` would estimate the reverse
    direction from samples of pi_theta, so it is biased here.) The log-ratio is clamped like the
    loss's, keeping the metric finite."""
    log_ratio = clamped_log_ratio(logprobs, old_logprobs)
    return torch.expm1(log_ratio) - log_ratio


@torch.no_grad()
def kept_contributions(
    ratio: Tensor, advantages: Tensor, mask: Tensor, *, low_bound: float, high_bound: float
) -> tuple[float, float]:
    """``(pos, neg)``: the summed ``|r*A|`` of the tokens whose surrogate term the clip keeps,
    A>0 with ``r <= high_bound`` and A<0 with ``r >= low_bound`` (for those the clipped
    surrogate is ``r*A``); the tokens the clip zeroes are left out. BAPO (arXiv 2510.18927)
    balances these two sums; every objective reports their share (``positive_share``)."""
    mask = mask.bool()
    ratio = zero_masked(ratio.detach(), mask)
    advantages = zero_masked(advantages.detach(), mask)
    contribution = (ratio * advantages).abs()
    positive = float(zero_masked(contribution, mask & (advantages > 0) & (ratio <= high_bound)).sum())
    negative = float(zero_masked(contribution, mask & (advantages < 0) & (ratio >= low_bound)).sum())
    return positive, negative


# Key prefix of the per-token tensors an objective adds to its metrics when called with
# ``inspect_tokens=True`` (the rollout inspector's steps only); the caller pops them before it
# combines the float metrics.
TOKEN_DETAIL = "tokens/"


@torch.no_grad()
def clip_removed_mask(ratio: Tensor, advantages: Tensor, mask: Tensor, *, low_bound: float, high_bound: float) -> Tensor | None:
    """The tokens whose gradient the clip removes, by the definition ``clip_frac_low`` and
    ``clip_frac_high`` count (their sum is this mask's share of ``mask``): A>0 with the ratio above
    ``high_bound`` (the clipped term ``clip(r)*A`` is the active min and constant in θ) and A<0 with
    it below ``low_bound``. None for an objective without a clip (bounds 0 and inf: CISPO, GPG,
    SAPO, KL-Cov): "n/a", not "nothing clipped"."""
    if low_bound <= 0.0 and math.isinf(high_bound):
        return None
    mask = mask.bool()
    return mask & (((advantages < 0) & (ratio < low_bound)) | ((advantages > 0) & (ratio > high_bound)))


def add_removed_tokens(metrics: dict[str, Any], removed: Tensor) -> None:
    """Under ``inspect_tokens``, add ``removed`` (tokens whose gradient the objective removes
    besides the clip's) to the ``tokens/clipped`` mask of ``metrics``; nothing otherwise. The metrics
    dict is typed for its floats, and this per-token tensor rides in it (:data:`TOKEN_DETAIL`)."""
    key = f"{TOKEN_DETAIL}clipped"
    if key in metrics:
        metrics[key] = metrics[key] | removed


@torch.no_grad()
def policy_metrics(
    *,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ratio: Tensor,
    low_bound: float,
    high_bound: float,
    policy_loss_per_token: Tensor,
    aggregation: str,
    high_prob_threshold: float,
    entropy: Tensor | None = None,
    kl: Tensor | None = None,
) -> dict[str, float]:
    """The metrics every objective reports (see the package docstring); inputs already zero-masked."""
    mask = mask.bool()
    dtype = ratio.dtype
    positive, negative = advantages > 0, advantages < 0
    metrics = {
        "clip_frac_low": float(masked_mean((negative & (ratio < low_bound)).to(dtype), mask)),
        "clip_frac_high": float(masked_mean((positive & (ratio > high_bound)).to(dtype), mask)),
        "ratio_mean": float(masked_mean(ratio, mask)),
        "ratio_min": float(torch.where(mask, ratio, torch.full_like(ratio, math.inf)).min()) if mask.any() else 1.0,
        "ratio_max": float(torch.where(mask, ratio, torch.full_like(ratio, -math.inf)).max()) if mask.any() else 1.0,
        "approx_kl": float(masked_mean(approx_kl_old_to_new(logprobs, old_logprobs), mask)),
    }
    if entropy is not None:
        metrics["entropy"] = float(masked_mean(entropy, mask))
    if kl is not None:
        metrics["kl"] = float(masked_mean(kl, mask))

    loss_mass = policy_loss_per_token.abs() * token_weights(mask, mode=aggregation, dtype=dtype)
    signed_mass = zero_masked(loss_mass, mask & (positive | negative)).sum()
    positive_mass = zero_masked(loss_mass, mask & positive).sum()
    metrics["pos_loss_share"] = float(positive_mass / signed_mass) if signed_mass > 0 else 0.0
    # The ratios' sums too: the learner combines micro-batches and ranks as a ratio of sums
    # (polyrl.algos.metric_parts), not as a mean of ratios.
    metrics.update(ratio_parts("pos_loss_share", float(positive_mass), float(signed_mass)))
    # BAPO's balance at this objective's own bounds, so an arm without BAPO's search reports the
    # share BAPO would steer; left out when no token contributes (a mean over steps stays honest).
    kept_positive, kept_negative = kept_contributions(ratio, advantages, mask, low_bound=low_bound, high_bound=high_bound)
    if kept_positive + kept_negative > 0:
        metrics["positive_share"] = kept_positive / (kept_positive + kept_negative)
    metrics.update(ratio_parts("positive_share", kept_positive, kept_positive + kept_negative))

    signed = mask & (positive | negative)
    high_prob = logprobs >= math.log(high_prob_threshold)
    denominator = max(int(signed.sum()), 1)
    for prob_name, prob_selector in (("high_prob", high_prob), ("low_prob", ~high_prob)):
        for adv_name, adv_selector in (("pos_adv", positive), ("neg_adv", negative)):
            count = int((signed & prob_selector & adv_selector).sum())
            metrics[f"quadrant/{prob_name}_{adv_name}"] = count / denominator
            metrics.update(ratio_parts(f"quadrant/{prob_name}_{adv_name}", count, int(signed.sum())))
    return metrics


@dataclass(frozen=True)
class ObjectiveInputs:
    """One micro-batch's inputs, zero-masked once (:meth:`zero_masked`), with the settings every
    objective's finalisation takes: the KL and entropy terms, aggregation and metrics."""

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    entropy: Tensor | None
    loss_normalizer: float
    aggregation: str
    ref_logprobs: Tensor | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    high_prob_threshold: float = 0.5
    # True on the rollout inspector's steps: :meth:`finalize` adds the ratio it was given and the
    # clip's mask (:func:`clip_removed_mask`) as tensors under ``tokens/`` keys (TOKEN_DETAIL).
    inspect_tokens: bool = False

    @classmethod
    def zero_masked(
        cls, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
        entropy: Tensor | None, loss_normalizer: float, aggregation: str, **shared: Any,
    ) -> "ObjectiveInputs":  # fmt: skip
        """Masked positions zeroed (old log-probs and advantages detached); ``shared`` holds the
        ``train.*`` settings (``ref_logprobs``, ``kl_coef``, ...); an unknown one is a TypeError."""
        masked = zero_masked_inputs(logprobs, old_logprobs, advantages, mask, entropy)
        return cls(*masked, loss_normalizer=loss_normalizer, aggregation=aggregation, **shared)

    def finalize(
        self, policy_loss_per_token: Tensor, *, ratio: Tensor, low_bound: float, high_bound: float,
        advantages: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:  # fmt: skip
        """Add the KL and entropy terms, aggregate, and compute the metrics. ``advantages``
        replaces the inputs' in the metrics (GSPO reports its per-sequence advantage)."""
        mask, entropy, per_token = self.mask, self.entropy, policy_loss_per_token
        kl = None
        if self.ref_logprobs is not None:
            kl = kl_penalty(self.logprobs, zero_masked(self.ref_logprobs, mask), estimator=self.kl_estimator)
            if self.kl_coef:
                per_token = per_token + self.kl_coef * kl
        elif self.kl_coef:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        if self.entropy_coef:
            if entropy is None:
                raise ValueError("entropy_coef > 0 needs the per-token entropy tensor")
            per_token = per_token - self.entropy_coef * entropy
        loss = aggregate(per_token, mask, mode=self.aggregation, loss_normalizer=self.loss_normalizer)
        metrics = policy_metrics(
            logprobs=self.logprobs.detach(),
            old_logprobs=self.old_logprobs,
            advantages=self.advantages if advantages is None else advantages,
            mask=mask,
            ratio=ratio.detach(),
            low_bound=low_bound,
            high_bound=high_bound,
            policy_loss_per_token=policy_loss_per_token.detach(),
            aggregation=self.aggregation,
            high_prob_threshold=self.high_prob_threshold,
            entropy=None if entropy is None else entropy.detach(),
            kl=None if kl is None else kl.detach(),
        )
        if self.inspect_tokens:
            metrics.update(self.token_detail(ratio, self.advantages if advantages is None else advantages, low_bound, high_bound))
        return loss, metrics

    def token_detail(self, ratio: Tensor, advantages: Tensor, low_bound: float, high_bound: float) -> dict[str, Any]:
        """The per-token ``tokens/ratio`` and (for an objective with a clip) ``tokens/clipped``, detached."""
        detail: dict[str, Any] = {f"{TOKEN_DETAIL}ratio": ratio.detach()}
        clipped = clip_removed_mask(ratio.detach(), advantages, self.mask, low_bound=low_bound, high_bound=high_bound)
        if clipped is not None:
            detail[f"{TOKEN_DETAIL}clipped"] = clipped
        return detail


def zero_masked_inputs(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, entropy: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    mask = mask.bool()
    return (
        zero_masked(logprobs, mask),
        zero_masked(old_logprobs.detach(), mask),
        zero_masked(advantages.detach(), mask),
        mask,
        None if entropy is None else zero_masked(entropy, mask),
    )
