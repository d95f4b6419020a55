"""Ratio objectives that bound the update without PPO's hard token clip: SAPO (a soft sigmoid
gate) and GMPO (the geometric mean of token ratios, clipped per token in log space)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from polyrl.algos.losses import masked_mean, zero_masked
from polyrl.algos.objectives.common import ObjectiveInputs, clamped_log_ratio, sequence_advantages
from polyrl.algos.objectives.registry import ObjectiveParams, register_objective
from polyrl.algos.params import number


class SAPOParams(ObjectiveParams):
    temperature_pos: float = number(1.0, gt=0, description="gate temperature tau for tokens with A > 0 (paper: 1.0)")
    temperature_neg: float = number(1.05, gt=0, description="gate temperature tau for tokens with A <= 0 (paper: 1.05)")


def sapo_gate(ratio: Tensor, temperature: Tensor) -> Tensor:
    """SAPO's gate ``f(r) = sigmoid(tau (r - 1)) * 4 / tau``: ``f(1) = 2/tau`` and ``f'(r) =
    4 sigmoid (1 - sigmoid)``, which is 1 at ``r = 1`` (the on-policy gradient is PPO's) and decays
    smoothly as ``r`` leaves 1, faster for a larger ``tau``."""
    return torch.sigmoid(temperature * (ratio - 1.0)) * (4.0 / temperature)


@register_objective(
    "sapo",
    description="SAPO: -f(r) * A with a soft sigmoid gate f instead of the hard clip; separate temperatures for A>0 / A<=0.",
    paper="Gao et al., Soft Adaptive Policy Optimization, arXiv 2511.20347",
    default_aggregation="seq_mean_token_mean",
    default_advantage="group_norm",
    params=SAPOParams,
    deviations="none in the loss: it equals TRL's loss_type 'sapo' and verl's 'sapo' on the same tensors (both use "
    "tau_pos where A > 0, tau_neg elsewhere, and the per-sequence token mean, the default aggregation here; "
    "verl forces that aggregation, polyrl lets objective.aggregation change it)",
)
def sapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_normalizer: float,
    aggregation: str,
    entropy: Tensor | None = None,
    temperature_pos: float = 1.0,
    temperature_neg: float = 1.05,
    **shared: Any,
) -> tuple[Tensor, dict[str, float]]:
    """SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347): per token ``-f(r) * A`` with
    ``f`` :func:`sapo_gate`, ``tau = temperature_pos`` where ``A > 0`` and ``temperature_neg``
    elsewhere (negative-advantage tokens are gated faster: their updates spread probability over
    the whole vocabulary and destabilise training sooner). No token's gradient is cut off; it
    fades as the ratio drifts."""
    x = ObjectiveInputs.zero_masked(logprobs, old_logprobs, advantages, mask, entropy=entropy,
                                    loss_normalizer=loss_normalizer, aggregation=aggregation, **shared)  # fmt: skip
    ratio = torch.exp(clamped_log_ratio(x.logprobs, x.old_logprobs))
    temperature = torch.where(
        x.advantages > 0, torch.full_like(ratio, temperature_pos), torch.full_like(ratio, temperature_neg)
    ).detach()
    per_token = -sapo_gate(ratio, temperature) * x.advantages
    loss, metrics = x.finalize(per_token, ratio=ratio, low_bound=0.0, high_bound=math.inf)
    with torch.no_grad():
        # The gate's slope: the factor on PPO's unclipped per-token gradient (1 on-policy).
        sigmoid = torch.sigmoid(temperature * (ratio.detach() - 1.0))
        metrics["sapo/gradient_weight_mean"] = float(masked_mean(4.0 * sigmoid * (1.0 - sigmoid), x.mask))
    return loss, metrics


class GMPOParams(ObjectiveParams):
    clip_low: float = number(0.4, ge=0, description="token log-ratio clipped below at -clip_low (paper: e^-0.4)")
    clip_high: float = number(0.4, ge=0, description="token log-ratio clipped above at +clip_high (paper: e^0.4)")


@register_objective(
    "gmpo",
    description="GMPO: geometric mean of the token ratios per sequence, each token clipped in log space.",
    paper="Zhao et al., Geometric-Mean Policy Optimization, arXiv 2507.20673",
    default_aggregation="seq_mean_token_mean",
    default_advantage="group_norm",
    params=GMPOParams,
    deviations="equal to verl's 'geo_mean' on the same tensors with clip_ratio_low/high = clip_low/high, except "
    "for the default: clip_low = clip_high = 0.4 here (the paper's range (e^-0.4, e^0.4)), verl's shared "
    "actor.clip_ratio_low/high 0.2 (its GMPO examples set 0.4), and except that verl averages over "
    "all rows of a micro-batch, a fully masked row included, and polyrl over rows with a response token. "
    "The sequence advantage is the row's mean token advantage (token advantages are not used per token, as verl). "
    "The token log-ratio is clamped to +-20 before the clip (no effect inside the clip range).",
)
def gmpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_normalizer: float,
    aggregation: str,
    entropy: Tensor | None = None,
    clip_low: float = 0.4,
    clip_high: float = 0.4,
    **shared: Any,
) -> tuple[Tensor, dict[str, float]]:
    """GMPO (Geometric-Mean Policy Optimization, arXiv 2507.20673): per sequence
    ``-A_i * exp(mean_t c_t)`` with ``c_t`` the token log-ratio clipped pessimistically in log
    space: for ``A > 0`` only above ``clip_high``, for ``A < 0`` only below ``-clip_low`` (the
    log-space form of PPO's ``min``), a clipped token passing no gradient.

    The geometric mean is far less sensitive to one outlier token than GRPO's arithmetic mean of
    ratios, which is what lets the paper widen the clip range to (e^-0.4, e^0.4). The sequence
    loss is written onto each response token, so the default ``seq_mean_token_mean`` is the mean
    over sequences.
    """
    x = ObjectiveInputs.zero_masked(logprobs, old_logprobs, advantages, mask, entropy=entropy,
                                    loss_normalizer=loss_normalizer, aggregation=aggregation, **shared)  # fmt: skip
    log_ratio = clamped_log_ratio(x.logprobs, x.old_logprobs)
    sign = torch.sign(x.advantages)
    clipped = torch.clamp(log_ratio, -clip_low, clip_high)
    # sign * min(sign * l, sign * clamp(l)): the pessimistic side of PPO's min, in log space.
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    lengths = x.mask.sum(dim=-1).clamp(min=1)
    seq_ratio = torch.exp(zero_masked(pessimistic, x.mask).sum(dim=-1) / lengths)
    seq_advantage = sequence_advantages(x.advantages, x.mask)
    per_token = (-seq_advantage * seq_ratio)[:, None].expand_as(x.logprobs)
    token_ratio = torch.exp(log_ratio)
    loss, metrics = x.finalize(per_token, ratio=token_ratio, low_bound=math.exp(-clip_low), high_bound=math.exp(clip_high))
    with torch.no_grad():
        metrics["gmpo/seq_ratio_mean"] = float(masked_mean(seq_ratio.detach()[:, None].expand_as(x.logprobs), x.mask))
    return loss, metrics
