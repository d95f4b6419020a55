"""Reward shapes, unscored rows and the metrics every estimator reports."""

from __future__ import annotations

import torch
from torch import Tensor

from polyrl.algos.losses import masked_mean_std, zero_masked


def sequence_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """[B] rewards: as given, or [B, T] token rewards summed over response tokens."""
    if rewards.dim() == 1:
        return rewards
    return zero_masked(rewards, mask).sum(dim=-1)


def last_response_index(mask: Tensor) -> Tensor:
    """[B] index of each row's last response token, -1 for rows without one."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(dim=-1).values


def token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """[B, T] rewards: as given (zeroed off the response), or [B] put on the last response token."""
    mask = mask.bool()
    if rewards.dim() == 2:
        return zero_masked(rewards, mask)
    last = last_response_index(mask)
    placed = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    placed[rows, last[rows]] = rewards[rows]
    return placed


def broadcast_to_tokens(sequence_values: Tensor, mask: Tensor) -> Tensor:
    return zero_masked(sequence_values[:, None].expand(mask.shape), mask)


def unscored_rows(rewards: Tensor, mask: Tensor) -> Tensor:
    """[B] bool: rows whose reward is NaN (for [B, T] rewards: NaN on any response token)."""
    if rewards.dim() == 1:
        return torch.isnan(rewards)
    return (torch.isnan(rewards) & mask.bool()).any(dim=-1)


def scored_mask(mask: Tensor, unscored: Tensor) -> Tensor:
    return mask.bool() & ~unscored[:, None]


def advantage_metrics(advantages: Tensor, mask: Tensor) -> dict[str, float]:
    mask = mask.bool()
    mean, std = masked_mean_std(advantages, mask)
    return {
        "advantage/mean": float(mean),
        "advantage/std": float(std),
        "advantage/abs_max": float(zero_masked(advantages, mask).abs().max()) if mask.any() else 0.0,
    }
