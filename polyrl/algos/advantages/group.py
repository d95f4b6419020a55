"""Group-relative estimators (GRPO, Dr.GRPO, RLOO): a sequence advantage from the rewards of
the other samples of the same prompt, broadcast to the response tokens."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from polyrl.algos.advantages.common import advantage_metrics, broadcast_to_tokens, scored_mask, sequence_rewards
from polyrl.algos.advantages.registry import AdvantageInputs, register_advantage
from polyrl.algos.groups import group_mean_std
from polyrl.algos.params import Params, flag, number

STD_SCALES: tuple[str, ...] = ("group", "batch")


def group_normalized(
    rewards: Tensor, group_ids: Tensor, *, use_std: bool = True, std_scale: str = "group", eps: float = 1e-6
) -> Tensor:
    """``(R - mean_group) / (std + eps)`` per sequence [B]; ``use_std=False`` keeps ``R - mean``.

    ``std_scale='group'`` divides by the group's std (GRPO); ``'batch'`` by the std of all
    scored rewards in the batch (group mean, batch std, as in "Tricks or Traps? A Deep Dive into
    RL for LLM Reasoning", arXiv 2508.08221), which avoids blowing up near-uniform groups.
    Unscored (NaN) rewards get 0 and enter no statistic.
    """
    if std_scale not in STD_SCALES:
        raise ValueError(f"unknown std_scale {std_scale!r}; allowed: {', '.join(STD_SCALES)}")
    scored = ~torch.isnan(rewards)
    mean, group_std, _ = group_mean_std(rewards, group_ids)
    centered = torch.where(scored, rewards - mean, torch.zeros_like(rewards))
    if not use_std:
        return centered
    if std_scale == "group":
        std = group_std
    elif int(scored.sum()) > 1:
        std = rewards[scored].std().expand_as(rewards)
    else:
        std = torch.zeros_like(rewards)
    return centered / (std + eps)


def _group_metrics(rewards: Tensor, group_ids: Tensor) -> dict[str, float]:
    """Share of scored samples whose group's scored rewards all agree (no group-relative signal)."""
    _, std, _ = group_mean_std(rewards, group_ids)
    scored = ~torch.isnan(rewards)
    uniform = ((std == 0) & scored).to(rewards.dtype).sum() / scored.sum().clamp(min=1)
    return {"advantage/uniform_group_sample_frac": float(uniform)}


def _group_result(sequence_advantage: Tensor, rewards: Tensor, inputs: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """Broadcast to tokens; metrics over the scored rows plus the group metrics."""
    advantages = broadcast_to_tokens(sequence_advantage, inputs.mask)
    scored = scored_mask(inputs.mask, torch.isnan(rewards))
    return advantages, {**advantage_metrics(advantages, scored), **_group_metrics(rewards, inputs.require("group_ids"))}


class GroupNormParams(Params):
    use_std: bool = flag(True, description="divide by the std (false: R - mean, Dr.GRPO's advantage)")
    std_scale: Literal["group", "batch"] = Field("group", description="std of the group (GRPO) or of the whole batch")
    eps: float = number(1e-6, gt=0, description="added to the std before dividing")


@register_advantage(
    "group_norm",
    description="Group-relative advantage (R - group mean) / (group std + eps), broadcast to tokens.",
    paper="Shao et al., DeepSeekMath, arXiv 2402.03300",
    requires=("group_ids",),
    params=GroupNormParams,
)
def group_norm_advantages(
    inputs: AdvantageInputs, *, use_std: bool = True, std_scale: str = "group", eps: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """GRPO's outcome advantage (Shao et al., "DeepSeekMath", arXiv 2402.03300, §4.1.2).

    Deviations: the unbiased group std (the paper does not say which), and the optional
    ``std_scale='batch'`` / ``use_std=False`` variants.
    """
    rewards = sequence_rewards(inputs.rewards, inputs.mask)
    normalized = group_normalized(rewards, inputs.require("group_ids"), use_std=use_std, std_scale=std_scale, eps=eps)
    return _group_result(normalized, rewards, inputs)


@register_advantage(
    "group_mean_centered",
    description="Dr.GRPO advantage R - group mean (no std division), broadcast to tokens.",
    paper="Liu et al., Understanding R1-Zero-Like Training: A Critical Perspective, arXiv 2503.20783",
    requires=("group_ids",),
)
def group_mean_centered_advantages(inputs: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """Dr.GRPO's advantage ``R - mean_group`` (arXiv 2503.20783): dividing by the group std
    up-weights questions that are too easy or too hard, so it is dropped. No deviations."""
    return group_norm_advantages(inputs, use_std=False)


@register_advantage(
    "rloo",
    description="REINFORCE leave-one-out: R_i minus the mean of the other samples of its group.",
    paper="Ahmadian et al., Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs, arXiv 2402.14740",
    requires=("group_ids",),
)
def rloo_advantages(inputs: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """RLOO: ``A_i = R_i - (sum_group - R_i) / (G - 1)``.

    Kool et al., "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (ICLR 2019 workshop);
    Ahmadian et al., arXiv 2402.14740. Deviation: a group of one scored sample gets advantage 0
    (there is no other sample to form a baseline from).
    """
    rewards = sequence_rewards(inputs.rewards, inputs.mask)
    scored = ~torch.isnan(rewards)
    mean, _, size = group_mean_std(rewards, inputs.require("group_ids"))  # over scored samples; size counts them
    others_mean = (mean * size - rewards) / (size - 1).clamp(min=1)
    sequence_advantage = torch.where(scored & (size > 1), rewards - others_mean, torch.zeros_like(rewards))
    return _group_result(sequence_advantage, rewards, inputs)
