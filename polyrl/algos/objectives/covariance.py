"""Covariance-selected entropy control: Clip-Cov and KL-Cov.

Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
arXiv 2505.22617, §4: the policy's entropy falls in proportion to the covariance between a
token's log-probability and its advantage, and a small share of tokens with a large covariance
drives the collapse. Both objectives pick those tokens by
``cov_t = (A_t - mean A) * (log pi_t - mean log pi)`` (means over the response tokens) and
restrain only them: Clip-Cov drops the gradient of a random few, KL-Cov adds ``|log r|`` to the
top-k.

The means and the selection threshold are batch-level choices: the registration's ``prepare``
computes them once per mini-batch (the learner calls it before its micro-batch loop) so that
the selected tokens do not depend on how the mini-batch is split. Called alone, without them,
each function prepares on its own inputs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import Field, model_validator
from torch import Tensor

from polyrl.algos.losses import masked_mean, zero_masked
from polyrl.algos.objectives.common import (
    ObjectiveInputs,
    add_removed_tokens,
    clamped_log_ratio,
    clipped_surrogate_per_token,
    token_ratio,
    zero_masked_inputs,
)
from polyrl.algos.objectives.ppo import symmetric_clip
from polyrl.algos.objectives.registry import ObjectiveParams, register_objective
from polyrl.algos.params import number

_PAPER = "Cui et al., The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models, arXiv 2505.22617, §4"


def token_covariance(logprobs: Tensor, advantages: Tensor, mask: Tensor, *, means: tuple[float, float] | None = None) -> Tensor:
    """``(A - mean A) * (log pi - mean log pi)`` per token [B, T], 0 off ``mask``; ``means``
    ``(mean A, mean log pi)`` are the mini-batch's (from ``prepare``), else ``mask``'s own."""
    mask = mask.bool()
    logprobs = zero_masked(logprobs.detach(), mask)
    advantages = zero_masked(advantages.detach(), mask)
    if means is None:
        means = (float(masked_mean(advantages, mask)), float(masked_mean(logprobs, mask)))
    return zero_masked((advantages - means[0]) * (logprobs - means[1]), mask)


def _content_seed(seed: int, old_logprobs: Tensor, mask: Tensor) -> int:
    """A generator seed from ``seed`` and the micro-batch's content: reruns draw the same tokens,
    different micro-batches and steps draw differently."""
    key = int(float(zero_masked(old_logprobs.detach(), mask).double().sum()) * 1e6) % (2**31)
    return (seed * 1_000_003 + key) % (2**62)


class ClipCovParams(ObjectiveParams):
    clip_low: float = number(0.2, ge=0, lt=1, description="PPO lower clip width of the tokens not selected")
    clip_high: float = number(0.2, ge=0, description="PPO upper clip width of the tokens not selected")
    clip_cov_ratio: float = number(
        2e-4, gt=0, le=1, description="r: share of response tokens whose gradient is dropped (paper: 2e-4)"
    )
    clip_cov_lb: float = number(1.0, description="omega_low: a candidate's covariance is above this (paper: 1)")
    clip_cov_ub: float = number(5.0, description="omega_high: a candidate's covariance is below this (paper: 5)")
    seed: int = Field(0, ge=0, strict=True, description="seed of the random pick (with the micro-batch's content)")

    @model_validator(mode="after")
    def _band(self) -> "ClipCovParams":
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb ({self.clip_cov_lb}) must be below clip_cov_ub ({self.clip_cov_ub})")
        return self


def _clip_cov_candidates(ratio: Tensor, advantages: Tensor, cov: Tensor, mask: Tensor, *, low_bound: float,
                         high_bound: float, lb: float, ub: float) -> Tensor:  # fmt: skip
    """Tokens inside the covariance band that PPO's clip has not already cut off."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, low_bound, high_bound)
    clipped_by_ppo = clipped > unclipped
    return mask.bool() & (cov > lb) & (cov < ub) & ~clipped_by_ppo


@torch.no_grad()
def clip_cov_prepare(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, entropy: Tensor | None = None, **params: Any
) -> dict[str, Any]:
    """Clip-Cov's batch-level choices over a whole mini-batch: ``cov_means`` (mean A, mean log pi)
    and ``cov_select_prob``, the probability with which each candidate is picked,
    ``min(1, max(1, int(r * tokens)) / candidates)`` (0 without candidates)."""
    p = ClipCovParams.model_construct(**{k: v for k, v in params.items() if k in ClipCovParams.model_fields})
    logprobs, old_logprobs, advantages, mask, _ = zero_masked_inputs(logprobs.detach(), old_logprobs, advantages, mask, None)
    means = (float(masked_mean(advantages, mask)), float(masked_mean(logprobs, mask)))
    cov = token_covariance(logprobs, advantages, mask, means=means)
    ratio = token_ratio(logprobs, old_logprobs)
    candidates = _clip_cov_candidates(ratio, advantages, cov, mask, low_bound=1.0 - p.clip_low,
                                      high_bound=1.0 + p.clip_high, lb=p.clip_cov_lb, ub=p.clip_cov_ub)  # fmt: skip
    wanted = max(int(p.clip_cov_ratio * int(mask.sum())), 1)
    count = int(candidates.sum())
    return {"cov_means": means, "cov_select_prob": min(1.0, wanted / count) if count else 0.0}


@register_objective(
    "clip_cov",
    description="Clip-Cov: PPO-clip, plus the gradient of a random few high-covariance tokens dropped (entropy control).",
    paper=_PAPER,
    default_aggregation="token_mean",
    default_advantage="group_norm",
    params=ClipCovParams,
    prepare=clip_cov_prepare,
    preset_clip=symmetric_clip,
    deviations="verl ('clip_cov') picks exactly max(1, int(r * tokens)) candidates per micro-batch without replacement; "
    "here each candidate is picked with probability that number / candidates (same expected count), with the "
    "means and probability taken over the whole mini-batch, so the pick does not depend on the micro-batch split "
    "and is reproducible from `seed`. When every candidate is picked the loss equals verl's. A picked token's "
    "loss is zeroed (value and gradient), as verl's",
)
def clip_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_normalizer: float,
    aggregation: str,
    entropy: Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    seed: int = 0,
    cov_means: tuple[float, float] | None = None,
    cov_select_prob: float | None = None,
    **shared: Any,
) -> tuple[Tensor, dict[str, float]]:
    """Clip-Cov (arXiv 2505.22617, §4): PPO-clip, except that among the tokens PPO keeps whose
    covariance lies in ``(clip_cov_lb, clip_cov_ub)`` a random share (about ``clip_cov_ratio`` of
    all response tokens) loses its loss and gradient. ``cov_means``/``cov_select_prob`` come from
    :func:`clip_cov_prepare` over the mini-batch (not user params)."""
    if cov_means is None or cov_select_prob is None:
        own: dict[str, Any] = {"clip_low": clip_low, "clip_high": clip_high, "clip_cov_ratio": clip_cov_ratio,
                               "clip_cov_lb": clip_cov_lb, "clip_cov_ub": clip_cov_ub}  # fmt: skip
        state = clip_cov_prepare(logprobs, old_logprobs, advantages, mask, **own)
        cov_means, cov_select_prob = state["cov_means"], state["cov_select_prob"]
    x = ObjectiveInputs.zero_masked(logprobs, old_logprobs, advantages, mask, entropy=entropy,
                                    loss_normalizer=loss_normalizer, aggregation=aggregation, **shared)  # fmt: skip
    ratio = token_ratio(x.logprobs, x.old_logprobs)
    low_bound, high_bound = 1.0 - clip_low, 1.0 + clip_high
    with torch.no_grad():
        cov = token_covariance(x.logprobs, x.advantages, x.mask, means=cov_means)
        candidates = _clip_cov_candidates(ratio.detach(), x.advantages, cov, x.mask, low_bound=low_bound,
                                          high_bound=high_bound, lb=clip_cov_lb, ub=clip_cov_ub)  # fmt: skip
        generator = torch.Generator(device="cpu").manual_seed(_content_seed(seed, x.old_logprobs, x.mask))
        draws = torch.rand(x.mask.shape, generator=generator, dtype=torch.float64).to(x.mask.device)
        picked = candidates & (draws < cov_select_prob)
    per_token = clipped_surrogate_per_token(ratio, x.advantages, low_bound=low_bound, high_bound=high_bound)
    per_token = torch.where(picked, torch.zeros_like(per_token), per_token)
    loss, metrics = x.finalize(per_token, ratio=ratio, low_bound=low_bound, high_bound=high_bound)
    dtype = ratio.dtype
    metrics["cov/selected_frac"] = float(masked_mean(picked.to(dtype), x.mask))
    metrics["cov/candidate_frac"] = float(masked_mean(candidates.to(dtype), x.mask))
    add_removed_tokens(metrics, picked)  # a picked token's loss and gradient are zeroed: removed as a clipped one's
    return loss, metrics


class KLCovParams(ObjectiveParams):
    kl_cov_ratio: float = number(
        2e-3, gt=0, le=1, description="k: share of response tokens with the largest covariance that get the KL term "
        "(paper: 2e-3 for its 7B model, 2e-4 for 32B; verl's default 2e-4)"
    )  # fmt: skip
    cov_kl_coef: float = number(1.0, ge=0, description="beta: coefficient of |log r| on the selected tokens (paper: 1)")


@torch.no_grad()
def kl_cov_prepare(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, entropy: Tensor | None = None, **params: Any
) -> dict[str, Any]:
    """KL-Cov's batch-level choices over a whole mini-batch: ``cov_means`` and ``cov_threshold``,
    the (k+1)-th largest covariance with ``k = max(1, int(kl_cov_ratio * tokens))`` (-inf when
    k covers every token): the tokens strictly above it are the top k, or fewer when values tie
    across the boundary (a batch whose advantages all agree has covariance 0 everywhere and
    selects none, rather than every token)."""
    ratio_share = params.get("kl_cov_ratio", KLCovParams.model_fields["kl_cov_ratio"].default)
    logprobs, _, advantages, mask, _ = zero_masked_inputs(logprobs.detach(), old_logprobs, advantages, mask, None)
    means = (float(masked_mean(advantages, mask)), float(masked_mean(logprobs, mask)))
    values = token_covariance(logprobs, advantages, mask, means=means)[mask]
    if not values.numel():
        return {"cov_means": means, "cov_threshold": math.inf}
    k = max(1, int(values.numel() * ratio_share))
    if k >= values.numel():
        return {"cov_means": means, "cov_threshold": -math.inf}
    return {"cov_means": means, "cov_threshold": float(torch.topk(values, k + 1).values[-1])}


@register_objective(
    "kl_cov",
    description="KL-Cov: unclipped -r*A, plus beta*|log r| on the top-k share of tokens by covariance (entropy control).",
    paper=_PAPER,
    default_aggregation="token_mean",
    default_advantage="group_norm",
    params=KLCovParams,
    prepare=kl_cov_prepare,
    deviations="equal to verl's 'kl_cov' on the same tensors when no covariance ties across the top-k boundary "
    "(with a tie polyrl selects only the tokens strictly above it, so at most k: a batch whose advantages all "
    "agree selects none; verl picks k arbitrary ones); the covariance means and the boundary are taken over the "
    "whole mini-batch (verl: per micro-batch), so the selection does not depend on the split; the log-ratio is "
    "clamped to +-20. Defaults against verl: kl_cov_ratio 2e-3 here (the paper's 7B setting), verl's "
    "policy_loss.kl_cov_ratio 2e-4 (the paper's 32B setting); cov_kl_coef (beta) 1 here (the paper's), verl's "
    "policy_loss.ppo_kl_coef 0.1 (its code falls back to 1 only when that setting is null)",
)
def kl_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_normalizer: float,
    aggregation: str,
    entropy: Tensor | None = None,
    kl_cov_ratio: float = 2e-3,
    cov_kl_coef: float = 1.0,
    cov_means: tuple[float, float] | None = None,
    cov_threshold: float | None = None,
    **shared: Any,
) -> tuple[Tensor, dict[str, float]]:
    """KL-Cov (arXiv 2505.22617, §4): per token ``-r * A`` (no clip), plus ``cov_kl_coef * |log r|``
    on the tokens whose covariance is among the top ``kl_cov_ratio`` share of the mini-batch
    (``cov_means``/``cov_threshold`` from :func:`kl_cov_prepare`, not user params)."""
    if cov_means is None or cov_threshold is None:
        state = kl_cov_prepare(logprobs, old_logprobs, advantages, mask, kl_cov_ratio=kl_cov_ratio)
        cov_means, cov_threshold = state["cov_means"], state["cov_threshold"]
    x = ObjectiveInputs.zero_masked(logprobs, old_logprobs, advantages, mask, entropy=entropy,
                                    loss_normalizer=loss_normalizer, aggregation=aggregation, **shared)  # fmt: skip
    log_ratio = clamped_log_ratio(x.logprobs, x.old_logprobs)
    ratio = torch.exp(log_ratio)
    with torch.no_grad():
        selected = x.mask & (token_covariance(x.logprobs, x.advantages, x.mask, means=cov_means) > cov_threshold)
    per_token = -x.advantages * ratio + torch.where(selected, cov_kl_coef * log_ratio.abs(), torch.zeros_like(ratio))
    loss, metrics = x.finalize(per_token, ratio=ratio, low_bound=0.0, high_bound=math.inf)
    metrics["cov/selected_frac"] = float(masked_mean(selected.to(ratio.dtype), x.mask))
    return loss, metrics
