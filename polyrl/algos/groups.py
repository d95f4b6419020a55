"""Per-prompt group statistics over a flat batch: the ``G`` samples of one prompt share a group id."""

from __future__ import annotations

import torch
from torch import Tensor


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """``(inverse [B], number of groups)``: each sample's group as 0..n-1 (ids need not be contiguous)."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max()) + 1 if inverse.numel() else 0


def group_mean_std(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample ``(group mean, group std, group size)`` [B] each, over the group's SCORED
    samples (NaN rewards are left out; ``size`` counts the scored ones).

    The std is the unbiased (Bessel-corrected, ``torch.std``'s default) estimate, as in the
    reference GRPO implementations that call ``torch.std``; groups of one scored sample get
    std 0, groups with none get mean 0.

    A group whose scored rewards all agree gets exactly that value as its mean and std 0: the
    sum divided by the count rounds (eight rewards of 0.1 average to 0.1 − 7e-9 in float32), and
    that rounding, divided by (std + eps), gave each of its samples a GRPO advantage of −0.007
    instead of 0 and kept the group out of the uniform-group counts.
    """
    inverse, num_groups = group_index(group_ids)
    scored = ~torch.isnan(rewards)
    safe = torch.where(scored, rewards, torch.zeros_like(rewards))
    sums = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device).index_add_(0, inverse, safe)
    counts = torch.zeros_like(sums).index_add_(0, inverse, scored.to(rewards.dtype))
    mean = (sums / counts.clamp(min=1))[inverse]
    high = torch.full_like(sums, -torch.inf).scatter_reduce(0, inverse, torch.where(scored, rewards, -torch.inf), reduce="amax")
    low = torch.full_like(sums, torch.inf).scatter_reduce(0, inverse, torch.where(scored, rewards, torch.inf), reduce="amin")
    constant = (high == low)[inverse]  # a group with no scored reward: -inf == inf is False
    mean = torch.where(constant, high[inverse], mean)
    deviations = torch.where(scored, (safe - mean).square(), torch.zeros_like(safe))
    squared = torch.zeros_like(sums).index_add_(0, inverse, deviations)
    size = counts[inverse]
    variance = torch.where((size > 1) & ~constant, squared[inverse] / (size - 1).clamp(min=1), torch.zeros_like(mean))
    return mean, variance.sqrt(), size
