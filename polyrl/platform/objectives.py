"""Policy objectives: pure tensor functions registered by name.

Every objective has the same call shape, so the learner looks one up by name and never branches
on it::

    loss, metrics = spec.fn(
        logprobs, old_logprobs, advantages, mask,        # [B, T] each
        loss_normalizer=global_loss_normalizer(whole_batch_mask, mode=aggregation),
        aggregation=aggregation,                         # one of AGGREGATION_MODES
        entropy=per_token_entropy_or_None,               # [B, T]
        **params,                                        # spec.default_params, overridden by config
    )

- ``mask`` is 1 on response tokens and 0 elsewhere; NaN/inf anywhere under ``mask == 0`` never
  reaches the loss or its gradient (inputs are zeroed with ``torch.where`` before any exp).
- ``advantages`` are token-level [B, T]; sequence-level advantages are broadcast by the caller
  (``adv[:, None] * mask``). Sequence objectives (``gspo``) take each row's masked mean.
- ``loss_normalizer`` is the GLOBAL denominator of the aggregation mode, computed once per
  rollout batch (see :mod:`polyrl.platform.aggregation`), so micro-batch losses simply add up.
- Shared optional params of every objective: ``ref_logprobs`` ([B, T] tensor) with ``kl_coef``
  (beta, default 0) and ``kl_estimator`` ('k1' | 'k2' | 'k3', default 'k3') add ``beta * KL`` per
  token before aggregation; ``entropy_coef`` (default 0) subtracts ``coef * entropy`` per token;
  ``high_prob_threshold`` (default 0.5) splits the token quadrants.

Metrics (floats, no grad, over response tokens):
``clip_frac_low`` / ``clip_frac_high`` — share of response tokens whose gradient the lower bound
(A<0, ratio below it) / upper bound (A>0, ratio above it) zeroes; ``ratio_mean/min/max`` of the
ratio the objective clips (the sequence ratio, per token, for GSPO); ``approx_kl`` — k3 of
old vs new log-probs; ``entropy`` when given; ``kl`` when ``ref_logprobs`` is given;
``pos_loss_share`` — share of the aggregation-weighted |policy loss| mass carried by A>0 tokens
among A≠0 tokens (0 when there is no such mass); and the four token quadrants of seed ``000``
§3.2, ``quadrant/{high,low}_prob_{pos,neg}_adv`` — shares of response tokens with A≠0, where
"high prob" means ``logprobs >= log(high_prob_threshold)``.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from polyrl.platform.aggregation import aggregate, check_aggregation_mode, token_weights
from polyrl.platform.losses import kl_penalty, masked_mean, zero_masked

ObjectiveFn = Callable[..., tuple[Tensor, dict[str, float]]]

# Params every objective accepts (through **shared) besides its own; tensors are excluded.
SHARED_PARAMS: dict[str, Any] = {
    "kl_coef": 0.0,
    "kl_estimator": "k3",
    "entropy_coef": 0.0,
    "high_prob_threshold": 0.5,
}

_COMMON_ARGUMENTS = {"logprobs", "old_logprobs", "advantages", "mask", "loss_normalizer", "aggregation", "entropy"}


@dataclass(frozen=True)
class ObjectiveSpec:
    name: str
    fn: ObjectiveFn
    description: str
    paper: str
    default_aggregation: str
    default_advantage: str
    default_params: dict[str, Any] = field(default_factory=dict)
    deviations: str = ""


_OBJECTIVES: dict[str, ObjectiveSpec] = {}


def _own_keyword_defaults(fn: Callable) -> dict[str, Any]:
    return {
        name: parameter.default
        for name, parameter in inspect.signature(fn).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
        and parameter.default is not inspect.Parameter.empty
        and name not in _COMMON_ARGUMENTS
    }


def register_objective(
    name: str,
    *,
    description: str,
    paper: str,
    default_aggregation: str,
    default_advantage: str,
    deviations: str = "",
    param_defaults: dict[str, Any] | None = None,
) -> Callable[[ObjectiveFn], ObjectiveFn]:
    """Register ``fn`` under ``name``; its default params are read from its keyword defaults,
    overridden by ``param_defaults``. One function can serve several named objectives that
    differ only in defaults (PPO, GRPO, Dr.GRPO and DAPO share the PPO-clip surrogate)."""
    check_aggregation_mode(default_aggregation)

    def decorator(fn: ObjectiveFn) -> ObjectiveFn:
        if name in _OBJECTIVES:
            raise ValueError(f"objective {name!r} is already registered")
        _OBJECTIVES[name] = ObjectiveSpec(
            name=name,
            fn=fn,
            description=description,
            paper=paper,
            default_aggregation=default_aggregation,
            default_advantage=default_advantage,
            default_params={**_own_keyword_defaults(fn), **(param_defaults or {}), **SHARED_PARAMS},
            deviations=deviations,
        )
        return fn

    return decorator


def get_objective(name: str) -> ObjectiveSpec:
    if name not in _OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; registered objectives: {', '.join(_OBJECTIVES)}")
    return _OBJECTIVES[name]


def list_objectives() -> list[ObjectiveSpec]:
    return list(_OBJECTIVES.values())


# ---------------------------------------------------------------------------------------------
# Shared pieces


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


def token_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    return torch.exp(logprobs - old_logprobs)


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Masked mean over tokens of ``log pi - log pi_old`` per row [B] (log of GSPO's s_i)."""
    mask = mask.bool()
    lengths = mask.sum(dim=-1).clamp(min=1)
    return zero_masked(logprobs - old_logprobs, mask).sum(dim=-1) / lengths


def sequence_advantages(advantages: Tensor, mask: Tensor) -> Tensor:
    """Each row's masked mean advantage [B]; equals the broadcast value for sequence advantages."""
    mask = mask.bool()
    lengths = mask.sum(dim=-1).clamp(min=1)
    return zero_masked(advantages, mask).sum(dim=-1) / lengths


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
    """The metrics every objective reports (see module docstring); inputs already zero-masked."""
    mask = mask.bool()
    dtype = ratio.dtype
    positive, negative = advantages > 0, advantages < 0
    metrics = {
        "clip_frac_low": float(masked_mean((negative & (ratio < low_bound)).to(dtype), mask)),
        "clip_frac_high": float(masked_mean((positive & (ratio > high_bound)).to(dtype), mask)),
        "ratio_mean": float(masked_mean(ratio, mask)),
        "ratio_min": float(torch.where(mask, ratio, torch.full_like(ratio, math.inf)).min()) if mask.any() else 1.0,
        "ratio_max": float(torch.where(mask, ratio, torch.full_like(ratio, -math.inf)).max()) if mask.any() else 1.0,
        "approx_kl": float(masked_mean(kl_penalty(logprobs, old_logprobs, estimator="k3"), mask)),
    }
    if entropy is not None:
        metrics["entropy"] = float(masked_mean(entropy, mask))
    if kl is not None:
        metrics["kl"] = float(masked_mean(kl, mask))

    loss_mass = policy_loss_per_token.abs() * token_weights(mask, mode=aggregation, dtype=dtype)
    signed_mass = zero_masked(loss_mass, mask & (positive | negative)).sum()
    positive_mass = zero_masked(loss_mass, mask & positive).sum()
    metrics["pos_loss_share"] = float(positive_mass / signed_mass) if signed_mass > 0 else 0.0

    signed = mask & (positive | negative)
    high_prob = logprobs >= math.log(high_prob_threshold)
    denominator = max(int(signed.sum()), 1)
    for prob_name, prob_selector in (("high_prob", high_prob), ("low_prob", ~high_prob)):
        for adv_name, adv_selector in (("pos_adv", positive), ("neg_adv", negative)):
            count = int((signed & prob_selector & adv_selector).sum())
            metrics[f"quadrant/{prob_name}_{adv_name}"] = count / denominator
    return metrics


def finalize_objective(
    policy_loss_per_token: Tensor,
    *,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ratio: Tensor,
    low_bound: float,
    high_bound: float,
    loss_normalizer: float,
    aggregation: str,
    entropy: Tensor | None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy_coef: float = 0.0,
    high_prob_threshold: float = 0.5,
) -> tuple[Tensor, dict[str, float]]:
    """Add the KL and entropy terms, aggregate, and compute metrics (inputs already zero-masked)."""
    per_token = policy_loss_per_token
    kl = None
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, zero_masked(ref_logprobs, mask), estimator=kl_estimator)
        if kl_coef:
            per_token = per_token + kl_coef * kl
    elif kl_coef:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    if entropy_coef:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the per-token entropy tensor")
        per_token = per_token - entropy_coef * entropy
    loss = aggregate(per_token, mask, mode=aggregation, loss_normalizer=loss_normalizer)
    metrics = policy_metrics(
        logprobs=logprobs.detach(),
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        ratio=ratio.detach(),
        low_bound=low_bound,
        high_bound=high_bound,
        policy_loss_per_token=policy_loss_per_token.detach(),
        aggregation=aggregation,
        high_prob_threshold=high_prob_threshold,
        entropy=None if entropy is None else entropy.detach(),
        kl=None if kl is None else kl.detach(),
    )
    return loss, metrics


def _zero_masked_inputs(
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


# ---------------------------------------------------------------------------------------------
# Token-ratio objectives: PPO and its group-advantage descendants


def _ppo_family(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_normalizer: float,
    aggregation: str,
    entropy: Tensor | None,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    **shared: Any,
) -> tuple[Tensor, dict[str, float]]:
    logprobs, old_logprobs, advantages, mask, entropy = _zero_masked_inputs(
        logprobs, old_logprobs, advantages, mask, entropy
    )
    ratio = token_ratio(logprobs, old_logprobs)
    low_bound, high_bound = 1.0 - clip_low, 1.0 + clip_high
    per_token = clipped_surrogate_per_token(
        ratio, advantages, low_bound=low_bound, high_bound=high_bound, dual_clip=dual_clip
    )
    loss, metrics = finalize_objective(
        per_token,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        ratio=ratio,
        low_bound=low_bound,
        high_bound=high_bound,
        loss_normalizer=loss_normalizer,
        aggregation=aggregation,
        entropy=entropy,
        **shared,
    )
    if dual_clip is not None:
        with torch.no_grad():
            # For A<0 the cap -c*A binds exactly when r > c.
            dual_clipped = (advantages < 0) & (ratio.detach() > dual_clip)
            metrics["dual_clip_frac"] = float(masked_mean(dual_clipped.to(ratio.dtype), mask))
    return loss, metrics


@register_objective(
    "ppo",
    description="PPO clipped surrogate with asymmetric clip range and optional dual clip.",
    paper="Schulman et al., Proximal Policy Optimization Algorithms, arXiv 1707.06347",
    default_aggregation="token_mean",
    default_advantage="gae",
    deviations="separate lower/upper clip widths (the paper has one epsilon); the loss is aggregated "
    "by the chosen mode instead of a plain mean over timesteps",
)
def ppo_loss(
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
    dual_clip: float | None = None,
    **shared: Any,
) -> tuple[Tensor, dict[str, float]]:
    """PPO-clip: ``-min(r*A, clip(r, 1-clip_low, 1+clip_high)*A)`` per token.

    Schulman et al., "Proximal Policy Optimization Algorithms", arXiv 1707.06347; dual clip from
    Ye et al., arXiv 1912.09729 (``dual_clip`` c > 1 caps the A<0 loss at ``c*|A|``).

    The same surrogate is registered as ``grpo``, ``dr_grpo`` and ``dapo``: those algorithms
    differ from PPO in their advantage estimator, loss aggregation and clip defaults, which the
    registry holds (each registration cites its paper and lists its deviations).
    """
    return _ppo_family(
        logprobs, old_logprobs, advantages, mask,
        loss_normalizer=loss_normalizer, aggregation=aggregation, entropy=entropy,
        clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, **shared,
    )  # fmt: skip


# GRPO (Shao et al., DeepSeekMath, arXiv 2402.03300): PPO-clip on group-normalised advantages,
# each sequence's token mean, KL to a reference in the loss.
register_objective(
    "grpo",
    description="PPO-clip on group-normalised advantages, per-sequence token mean.",
    paper="Shao et al., DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models, arXiv 2402.03300",
    default_aggregation="seq_mean_token_mean",
    default_advantage="group_norm",
    deviations="kl_coef defaults to 0 (the paper uses 0.04 with the k3 estimator, the default kl_estimator here)",
)(ppo_loss)

# Dr.GRPO (Liu et al., arXiv 2503.20783): the two fixes are the advantage R - mean_group and the
# constant normaliser sum / (num_seqs * L_max); the per-token surrogate is PPO-clip.
register_objective(
    "dr_grpo",
    description="GRPO without length and std biases: mean-centred advantages, constant normaliser.",
    paper="Liu et al., Understanding R1-Zero-Like Training: A Critical Perspective, arXiv 2503.20783",
    default_aggregation="seq_sum_constant_norm",
    default_advantage="group_mean_centered",
)(ppo_loss)

# DAPO (Yu et al., arXiv 2503.14476): decoupled clip (clip-higher 0.2/0.28) and the token-level
# mean over the batch; dynamic sampling and overlong shaping are data-side
# (advantages.dapo_dynamic_sampling_keep, advantages.dapo_overlong_penalty).
register_objective(
    "dapo",
    description="Clip-higher PPO (0.2/0.28) with token-level mean over the whole batch.",
    paper="Yu et al., DAPO: An Open-Source LLM Reinforcement Learning System at Scale, arXiv 2503.14476",
    default_aggregation="token_mean",
    default_advantage="group_norm",
    deviations="an optional KL term is allowed (the paper drops it)",
    param_defaults={"clip_high": 0.28},
)(ppo_loss)


# ---------------------------------------------------------------------------------------------
# Sequence-ratio objectives

_GSPO_PAPER = "Zheng et al., Group Sequence Policy Optimization, arXiv 2507.18071"


@register_objective(
    "gspo",
    description="Sequence-level ratio (geometric mean of token ratios), clipped per sequence.",
    paper=_GSPO_PAPER,
    default_aggregation="seq_mean_token_mean",
    default_advantage="group_norm",
)
def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_normalizer: float,
    aggregation: str,
    entropy: Tensor | None = None,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    **shared: Any,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO: ``s_i = exp(mean_t (log pi - log pi_old))``, loss ``-min(s_i A_i, clip(s_i) A_i)``.

    Zheng et al., "Group Sequence Policy Optimization", arXiv 2507.18071; defaults are the
    paper's clip ranges 3e-4 / 4e-4. ``A_i`` is the row's masked-mean advantage. The sequence
    loss is written onto each of its response tokens, so the default ``seq_mean_token_mean``
    gives the paper's mean over sequences; ``token_mean`` would weight sequences by length
    (a deviation the user opts into). Seed ``003`` writes s_i as an arithmetic mean of token
    ratios; the paper (and this code) uses the geometric mean.
    """
    logprobs, old_logprobs, advantages, mask, entropy = _zero_masked_inputs(
        logprobs, old_logprobs, advantages, mask, entropy
    )
    seq_ratio = torch.exp(sequence_log_ratio(logprobs, old_logprobs, mask))
    seq_advantage = sequence_advantages(advantages, mask)
    low_bound, high_bound = 1.0 - clip_low, 1.0 + clip_high
    seq_loss = clipped_surrogate_per_token(seq_ratio, seq_advantage, low_bound=low_bound, high_bound=high_bound)
    per_token = seq_loss[:, None].expand_as(logprobs)
    ratio_per_token = seq_ratio[:, None].expand_as(logprobs)
    advantage_per_token = seq_advantage[:, None].expand_as(logprobs)
    return finalize_objective(
        per_token,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantage_per_token,
        mask=mask,
        ratio=ratio_per_token,
        low_bound=low_bound,
        high_bound=high_bound,
        loss_normalizer=loss_normalizer,
        aggregation=aggregation,
        entropy=entropy,
        **shared,
    )


@register_objective(
    "gspo_token",
    description="GSPO-token: sequence-clipped ratio sg[s_i]*pi/sg[pi] allowing token advantages.",
    paper=_GSPO_PAPER,
    default_aggregation="seq_mean_token_mean",
    default_advantage="group_norm",
)
def gspo_token_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_normalizer: float,
    aggregation: str,
    entropy: Tensor | None = None,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    **shared: Any,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO-token: ``s_{i,t} = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)]`` with token advantages.

    Zheng et al., arXiv 2507.18071, §4.3. The value of ``s_{i,t}`` equals ``s_i`` (so clipping is
    decided per sequence) while its gradient is ``s_i * grad log pi(y_t)``; with sequence-constant
    advantages and ``seq_mean_token_mean`` it has exactly GSPO's gradient. No deviations.
    """
    logprobs, old_logprobs, advantages, mask, entropy = _zero_masked_inputs(
        logprobs, old_logprobs, advantages, mask, entropy
    )
    seq_ratio = torch.exp(sequence_log_ratio(logprobs, old_logprobs, mask)).detach()
    ratio = seq_ratio[:, None] * torch.exp(logprobs - logprobs.detach())
    low_bound, high_bound = 1.0 - clip_low, 1.0 + clip_high
    per_token = clipped_surrogate_per_token(ratio, advantages, low_bound=low_bound, high_bound=high_bound)
    return finalize_objective(
        per_token,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        ratio=ratio,
        low_bound=low_bound,
        high_bound=high_bound,
        loss_normalizer=loss_normalizer,
        aggregation=aggregation,
        entropy=entropy,
        **shared,
    )


# ---------------------------------------------------------------------------------------------
# BAPO

_BAPO_PAPER = (
    "Xi et al., BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced "
    "Policy Optimization with Adaptive Clipping, arXiv 2510.18927"
)


@torch.no_grad()
def bapo_positive_share(ratio: Tensor, advantages: Tensor, mask: Tensor, *, c_low: float, c_high: float) -> float:
    """``pos / (pos + neg)`` of the clipped-surrogate contributions under bounds [c_low, c_high].

    ``pos = sum r*A`` over response tokens with A>0 and ``r <= c_high``; ``neg = sum r*|A|`` over
    response tokens with A<0 and ``r >= c_low``. Tokens outside the bound on the side where PPO
    clipping zeroes their gradient (A>0 above c_high, A<0 below c_low) are excluded; for the
    kept tokens the clipped surrogate equals ``r*A``. Returns 1.0 when ``neg == 0`` (nothing to
    balance, so the search stops). The authors' verl recipe instead counts every token with
    the ratio clamped to the bound (``min(r, c_high)*A`` / ``max(r, c_low)*A``).
    """
    mask = mask.bool()
    ratio = zero_masked(ratio.detach(), mask)
    advantages = zero_masked(advantages.detach(), mask)
    kept_positive = mask & (advantages > 0) & (ratio <= c_high)
    kept_negative = mask & (advantages < 0) & (ratio >= c_low)
    contribution = (ratio * advantages).abs()
    positive = float(zero_masked(contribution, kept_positive).sum())
    negative = float(zero_masked(contribution, kept_negative).sum())
    if negative <= 0.0:
        return 1.0
    return positive / (positive + negative)


def _raised_bound(start: float, step: float, steps: int, maximum: float) -> float:
    # start + k*step instead of repeated += keeps the grid free of accumulated rounding.
    value = start + steps * step
    return maximum if value >= maximum - 1e-9 else value


def bapo_search_clip_bounds(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    c_low_start: float = 0.6,
    c_low_max: float = 0.9,
    c_high_start: float = 1.2,
    c_high_max: float = 3.0,
    c_low_step: float = 0.05,
    c_high_step: float = 0.1,
    target_positive_share: float = 0.5,
) -> tuple[float, float, float]:
    """BAPO's adaptive clipping search (Algorithm 1 of arXiv 2510.18927); returns
    ``(c_low, c_high, positive_share)``.

    Starting from ``(c_low_start, c_high_start)``, raise ``c_low`` by ``c_low_step`` up to
    ``c_low_max`` (each step drops more low-ratio negative tokens), then raise ``c_high`` by
    ``c_high_step`` up to ``c_high_max`` (each step admits more high-ratio positive tokens),
    stopping as soon as :func:`bapo_positive_share` reaches ``target_positive_share`` (rho_0).
    The last step is shortened to land exactly on the maximum. ``ratio`` and ``advantages`` are
    detached. Defaults are the ranges of the authors' README (c_low in [0.6, 0.9], c_high in
    [1.2, 3.0], rho_0 = 0.5). Deviation: the step sizes are ours.
    """
    if c_low_step <= 0 or c_high_step <= 0:
        raise ValueError("c_low_step and c_high_step must be > 0")

    def share(c_low: float, c_high: float) -> float:
        return bapo_positive_share(ratio, advantages, mask, c_low=c_low, c_high=c_high)

    c_low, c_high = c_low_start, c_high_start
    positive_share = share(c_low, c_high)
    steps = 0
    while positive_share < target_positive_share and c_low < c_low_max:
        steps += 1
        c_low = _raised_bound(c_low_start, c_low_step, steps, c_low_max)
        positive_share = share(c_low, c_high)
    steps = 0
    while positive_share < target_positive_share and c_high < c_high_max:
        steps += 1
        c_high = _raised_bound(c_high_start, c_high_step, steps, c_high_max)
        positive_share = share(c_low, c_high)
    return c_low, c_high, positive_share


def bapo_search_steps(c_low: float, c_high: float, *, c_low_start: float, c_high_start: float,
                      c_low_step: float, c_high_step: float) -> int:  # fmt: skip
    """Number of raises the search made to reach ``(c_low, c_high)`` (the last may be partial)."""
    low_steps = math.ceil((c_low - c_low_start) / c_low_step - 1e-6) if c_low > c_low_start else 0
    high_steps = math.ceil((c_high - c_high_start) / c_high_step - 1e-6) if c_high > c_high_start else 0
    return low_steps + high_steps


def entropy_adaptive_epsilon(mean_entropy: float, *, epsilon_base: float, alpha: float, entropy_target: float) -> float:
    """Seed ``000`` §2.2: ``eps_t = eps_base * (1 + alpha * (H_target - H_t))``, kept in [0, 0.99].

    The formula widens the clip range when entropy falls below the target (the DESIGN health
    check's remedy for collapse). The seed's prose says the opposite (wider when entropy is high
    early on, tighter as the policy degenerates); a negative ``alpha`` gives that behaviour.
    """
    epsilon = epsilon_base * (1.0 + alpha * (entropy_target - mean_entropy))
    return min(max(epsilon, 0.0), 0.99)


def positive_weight(actual_share: float, *, target_share: float, beta: float, sign: float) -> float:
    """Seed ``000`` §2.3: ``lambda_pos = sigmoid(sign * beta * (C_actual - C_target))``.

    As written in the seed (``sign=+1``) lambda_pos grows when positive contributions already
    exceed the target, which pushes further from balance; ``sign=-1`` is the balancing direction.
    """
    return 1.0 / (1.0 + math.exp(-sign * beta * (actual_share - target_share)))


@register_objective(
    "bapo",
    description="PPO-clip with per-step adaptive bounds balancing positive/negative contributions.",
    paper=_BAPO_PAPER,
    default_aggregation="token_mean",
    default_advantage="group_norm",
)
def bapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_normalizer: float,
    aggregation: str,
    entropy: Tensor | None = None,
    c_low_start: float = 0.6,
    c_low_max: float = 0.9,
    c_high_start: float = 1.2,
    c_high_max: float = 3.0,
    c_low_step: float = 0.05,
    c_high_step: float = 0.1,
    target_positive_share: float = 0.5,
    bound_search: bool = True,
    clip_bounds: tuple[float, float] | None = None,
    dual_clip: float | None = None,
    entropy_adaptive_clip: bool = False,
    clip_eps_base: float = 0.2,
    entropy_clip_alpha: float = 0.2,
    entropy_target: float = 1.5,
    positive_weight_sigmoid: bool = False,
    positive_weight_target: float = 0.45,
    positive_weight_beta: float = 5.0,
    positive_weight_sign: float = 1.0,
    **shared: Any,
) -> tuple[Tensor, dict[str, float]]:
    """BAPO: PPO-clip whose ratio bounds ``[c_low, c_high]`` are searched every call.

    Xi et al., "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy
    Optimization with Adaptive Clipping", arXiv 2510.18927. The bounds come from
    :func:`bapo_search_clip_bounds` on this call's (detached) ratios, then the loss is
    ``-min(r*A, clip(r, c_low, c_high)*A)`` (optionally dual-clipped, as the authors' recipe
    does with c=3).

    State: none is kept between calls. The search sees only the tensors it is given, so with
    micro-batching each micro-batch picks its own bounds; for split-invariant bounds, run
    :func:`bapo_search_clip_bounds` once over the whole batch and pass ``clip_bounds``.
    ``bound_search=False`` uses the start bounds as they are.

    Options from seed ``000`` (not in the paper):
    - ``entropy_adaptive_clip``: the search starts from ``1 -/+ eps_t`` with
      ``eps_t = clip_eps_base * (1 + entropy_clip_alpha * (entropy_target - H_t))``, ``H_t`` the
      masked mean of ``entropy`` (see :func:`entropy_adaptive_epsilon` for the seed's
      contradictory prose).
    - ``positive_weight_sigmoid``: A>0 token losses are weighted by
      ``lambda_pos = sigmoid(positive_weight_sign * beta * (C_actual - C_target))`` and A<0 ones
      by ``1 - lambda_pos``, with C_actual the positive share at the chosen bounds. With the
      seed's sign (+1, default) lambda_pos rises when positives already dominate, moving away
      from balance; use ``positive_weight_sign=-1`` to push towards C_target. At balance both
      weights are 0.5, halving the loss scale, as in the seed's code.
    """
    logprobs, old_logprobs, advantages, mask, entropy = _zero_masked_inputs(
        logprobs, old_logprobs, advantages, mask, entropy
    )
    ratio = token_ratio(logprobs, old_logprobs)
    extra: dict[str, float] = {}
    if entropy_adaptive_clip:
        if entropy is None:
            raise ValueError("entropy_adaptive_clip needs the per-token entropy tensor")
        epsilon = entropy_adaptive_epsilon(
            float(masked_mean(entropy.detach(), mask)),
            epsilon_base=clip_eps_base, alpha=entropy_clip_alpha, entropy_target=entropy_target,
        )  # fmt: skip
        c_low_start, c_high_start = 1.0 - epsilon, 1.0 + epsilon
        extra["bapo/clip_eps"] = epsilon

    if clip_bounds is not None:
        c_low, c_high = clip_bounds
        positive_share = bapo_positive_share(ratio, advantages, mask, c_low=c_low, c_high=c_high)
    elif bound_search:
        c_low, c_high, positive_share = bapo_search_clip_bounds(
            ratio.detach(), advantages, mask,
            c_low_start=c_low_start, c_low_max=c_low_max, c_high_start=c_high_start, c_high_max=c_high_max,
            c_low_step=c_low_step, c_high_step=c_high_step, target_positive_share=target_positive_share,
        )  # fmt: skip
    else:
        c_low, c_high = c_low_start, c_high_start
        positive_share = bapo_positive_share(ratio, advantages, mask, c_low=c_low, c_high=c_high)
    search_steps = bapo_search_steps(
        c_low, c_high, c_low_start=c_low_start, c_high_start=c_high_start,
        c_low_step=c_low_step, c_high_step=c_high_step,
    ) if clip_bounds is None else 0  # fmt: skip

    per_token = clipped_surrogate_per_token(ratio, advantages, low_bound=c_low, high_bound=c_high, dual_clip=dual_clip)
    if positive_weight_sigmoid:
        weight = positive_weight(
            positive_share, target_share=positive_weight_target, beta=positive_weight_beta, sign=positive_weight_sign
        )
        token_weight = torch.where(
            advantages > 0,
            torch.full_like(per_token, weight),
            torch.where(advantages < 0, torch.full_like(per_token, 1.0 - weight), torch.ones_like(per_token)),
        )
        per_token = per_token * token_weight
        extra["bapo/positive_weight"] = weight

    loss, metrics = finalize_objective(
        per_token,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        ratio=ratio,
        low_bound=c_low,
        high_bound=c_high,
        loss_normalizer=loss_normalizer,
        aggregation=aggregation,
        entropy=entropy,
        **shared,
    )
    metrics.update(
        {
            "bapo/c_low": float(c_low),
            "bapo/c_high": float(c_high),
            "bapo/positive_share": float(positive_share),
            "bapo/search_steps": float(search_steps),
            **extra,
        }
    )
    return loss, metrics
