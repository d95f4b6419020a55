"""Sequence-ratio objectives: GSPO and GSPO-token (Zheng et al., arXiv 2507.18071)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from polyrl.algos.objectives.common import (
    ObjectiveInputs,
    clipped_surrogate_per_token,
    sequence_advantages,
    sequence_log_ratio,
)
from polyrl.algos.objectives.registry import ObjectiveParams, register_objective
from polyrl.algos.params import number

_GSPO_PAPER = "Zheng et al., Group Sequence Policy Optimization, arXiv 2507.18071"
_GSPO_VERL_DEFAULTS = (
    "log s_i is clamped to +-20 before the exp (it never overflows). Against verl: the clip widths default to the "
    "paper's 3e-4 / 4e-4; verl's 'gspo' reads the shared actor.clip_ratio_low/high, 0.2 by default, so there they "
    "must be set to 3e-4 / 4e-4 for the paper's"
)


class GSPOParams(ObjectiveParams):
    clip_low: float = number(3e-4, ge=0, lt=1, description="lower clip width of the sequence ratio (paper: 3e-4)")
    clip_high: float = number(4e-4, ge=0, description="upper clip width of the sequence ratio (paper: 4e-4)")


# No preset_clip: the sequence ratio is a geometric mean over tokens, so its clip widths are on
# a scale ~1e-4 (the paper's 3e-4 / 4e-4); a preset's token-level epsilon (0.1-0.2) would
# switch clipping off. Presets keep GSPO's own widths.


@register_objective(
    "gspo",
    description="Sequence-level ratio (geometric mean of token ratios), clipped per sequence.",
    paper=_GSPO_PAPER,
    default_aggregation="seq_mean_token_mean",
    default_advantage="group_norm",
    params=GSPOParams,
    deviations=_GSPO_VERL_DEFAULTS,
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
    (a deviation the user opts into). s_i is the paper's length-normalised sequence ratio, the
    geometric mean of the token ratios (not their arithmetic mean). Deviation: ``log s_i`` is
    clamped to +-20 before the exp (as the token log-ratio is), so it never overflows.
    """
    x = ObjectiveInputs.zero_masked(logprobs, old_logprobs, advantages, mask, entropy=entropy,
                                    loss_normalizer=loss_normalizer, aggregation=aggregation, **shared)  # fmt: skip
    seq_ratio = torch.exp(sequence_log_ratio(x.logprobs, x.old_logprobs, x.mask))
    seq_advantage = sequence_advantages(x.advantages, x.mask)
    low_bound, high_bound = 1.0 - clip_low, 1.0 + clip_high
    seq_loss = clipped_surrogate_per_token(seq_ratio, seq_advantage, low_bound=low_bound, high_bound=high_bound)
    per_token = seq_loss[:, None].expand_as(x.logprobs)
    return x.finalize(per_token, ratio=seq_ratio[:, None].expand_as(x.logprobs), low_bound=low_bound, high_bound=high_bound,
                      advantages=seq_advantage[:, None].expand_as(x.logprobs))  # fmt: skip


@register_objective(
    "gspo_token",
    description="GSPO-token: sequence-clipped ratio sg[s_i]*pi/sg[pi] allowing token advantages.",
    paper=_GSPO_PAPER,
    default_aggregation="seq_mean_token_mean",
    default_advantage="group_norm",
    params=GSPOParams,
    deviations=_GSPO_VERL_DEFAULTS,
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
    advantages and ``seq_mean_token_mean`` it has exactly GSPO's gradient. Deviation: ``log s_i``
    is clamped to +-20, as in :func:`gspo_loss`.
    """
    x = ObjectiveInputs.zero_masked(logprobs, old_logprobs, advantages, mask, entropy=entropy,
                                    loss_normalizer=loss_normalizer, aggregation=aggregation, **shared)  # fmt: skip
    seq_ratio = torch.exp(sequence_log_ratio(x.logprobs, x.old_logprobs, x.mask)).detach()
    ratio = seq_ratio[:, None] * torch.exp(x.logprobs - x.logprobs.detach())
    low_bound, high_bound = 1.0 - clip_low, 1.0 + clip_high
    per_token = clipped_surrogate_per_token(ratio, x.advantages, low_bound=low_bound, high_bound=high_bound)
    return x.finalize(per_token, ratio=ratio, low_bound=low_bound, high_bound=high_bound)
