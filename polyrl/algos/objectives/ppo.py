"""Token-ratio objectives: PPO and its group-advantage descendants GRPO, Dr.GRPO and DAPO."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from polyrl.algos.losses import masked_mean
from polyrl.algos.objectives.common import (
    ObjectiveInputs,
    add_removed_tokens,
    clipped_surrogate_per_token,
    token_ratio,
)
from polyrl.algos.objectives.registry import ObjectiveParams, register_objective
from polyrl.algos.params import number


class PPOParams(ObjectiveParams):
    clip_low: float = number(0.2, ge=0, lt=1, description="lower clip width: the ratio is clipped below at 1 - clip_low")
    clip_high: float = number(0.2, ge=0, description="upper clip width: the ratio is clipped above at 1 + clip_high")
    dual_clip: float | None = number(
        None, gt=1, description="dual-clip c (> 1): caps the loss of A<0 tokens at c*|A|; null = off"
    )


class DAPOParams(PPOParams):
    clip_high: float = number(0.28, ge=0, description="upper clip width (DAPO's clip-higher: 0.28 against clip_low 0.2)")


# verl's PPO-clip loss ('vanilla', which its GRPO, DAPO, RLOO, REINFORCE++ and ReMax runs use)
# always dual-clips: actor.clip_ratio_c defaults to 3. polyrl's dual_clip is off by default.
VERL_DUAL_CLIP = (
    "dual_clip is off by default; verl's PPO loss ('vanilla') always dual-clips A<0 tokens at "
    "actor.clip_ratio_c, 3 by default (dual_clip: 3 gives its loss)"
)


def symmetric_clip(epsilon: float) -> dict[str, float]:
    return {"clip_low": epsilon, "clip_high": epsilon}


# DAPO's clip-higher decouples the bounds: the paper's 0.2 / 0.28 is a gap of 0.08 above the
# lower width. A preset's epsilon sets the lower width and the gap is kept, because the
# asymmetry (more room for low-probability tokens to rise) is the point of the algorithm.
DAPO_CLIP_HIGHER_GAP = 0.08


def dapo_preset_clip(epsilon: float) -> dict[str, float]:
    return {"clip_low": epsilon, "clip_high": epsilon + DAPO_CLIP_HIGHER_GAP}


@register_objective(
    "ppo",
    description="PPO clipped surrogate with asymmetric clip range and optional dual clip.",
    paper="Schulman et al., Proximal Policy Optimization Algorithms, arXiv 1707.06347",
    default_aggregation="token_mean",
    default_advantage="gae",
    params=PPOParams,
    preset_clip=symmetric_clip,
    deviations="separate lower/upper clip widths (the paper has one epsilon); the loss is aggregated "
    "by the chosen mode instead of a plain mean over timesteps. Against verl: " + VERL_DUAL_CLIP,
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
    x = ObjectiveInputs.zero_masked(logprobs, old_logprobs, advantages, mask, entropy=entropy,
                                    loss_normalizer=loss_normalizer, aggregation=aggregation, **shared)  # fmt: skip
    ratio = token_ratio(x.logprobs, x.old_logprobs)
    low_bound, high_bound = 1.0 - clip_low, 1.0 + clip_high
    per_token = clipped_surrogate_per_token(ratio, x.advantages, low_bound=low_bound, high_bound=high_bound, dual_clip=dual_clip)
    loss, metrics = x.finalize(per_token, ratio=ratio, low_bound=low_bound, high_bound=high_bound)
    if dual_clip is not None:
        with torch.no_grad():
            # For A<0 the cap -c*A binds exactly when r > c.
            dual_clipped = (x.advantages < 0) & (ratio.detach() > dual_clip)
            metrics["dual_clip_frac"] = float(masked_mean(dual_clipped.to(ratio.dtype), x.mask))
            # The cap -c*A is constant in θ too: its tokens lose their gradient.
            add_removed_tokens(metrics, dual_clipped & x.mask)
    return loss, metrics


# GRPO (Shao et al., DeepSeekMath, arXiv 2402.03300): PPO-clip on group-normalised advantages,
# each sequence's token mean, KL to a reference in the loss.
register_objective(
    "grpo",
    description="PPO-clip on group-normalised advantages, per-sequence token mean.",
    paper="Shao et al., DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models, arXiv 2402.03300",
    default_aggregation="seq_mean_token_mean",
    default_advantage="group_norm",
    params=PPOParams,
    preset_clip=symmetric_clip,
    deviations="train.kl_coef defaults to 0 (the paper uses 0.04 with the k3 estimator, the default train.kl_estimator). "
    "Against verl: its KL loss is off by default too (actor.use_kl_loss false; when on, kl_loss_coef 0.001 with "
    "low_var_kl, the k3 estimator); " + VERL_DUAL_CLIP,
)(ppo_loss)

# Dr.GRPO (Liu et al., arXiv 2503.20783): the two fixes are the advantage R - mean_group and the
# constant normaliser sum / (num_seqs * L_max); the per-token surrogate is PPO-clip.
register_objective(
    "dr_grpo",
    description="GRPO without length and std biases: mean-centred advantages, constant normaliser.",
    paper="Liu et al., Understanding R1-Zero-Like Training: A Critical Perspective, arXiv 2503.20783",
    default_aggregation="seq_sum_constant_norm",
    default_advantage="group_mean_centered",
    params=PPOParams,
    preset_clip=symmetric_clip,
    deviations="none from the paper. Against verl: " + VERL_DUAL_CLIP,
)(ppo_loss)

# DAPO (Yu et al., arXiv 2503.14476): decoupled clip (clip-higher 0.2/0.28) and the token-level
# mean over the mini-batch; dynamic sampling and overlong shaping are data-side
# (advantages.dapo_dynamic_sampling_keep, advantages.dapo_overlong_penalty).
register_objective(
    "dapo",
    description="Clip-higher PPO (0.2/0.28) with token-level mean over the mini-batch.",
    paper="Yu et al., DAPO: An Open-Source LLM Reinforcement Learning System at Scale, arXiv 2503.14476",
    default_aggregation="token_mean",
    default_advantage="group_norm",
    params=DAPOParams,
    preset_clip=dapo_preset_clip,
    deviations="an optional KL term is allowed (the paper drops it). Against verl: clip_high defaults to the "
    "paper's 0.28, verl's actor.clip_ratio_high to 0.2 (its DAPO recipe sets 0.28); " + VERL_DUAL_CLIP,
)(ppo_loss)
