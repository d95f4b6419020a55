"""REINFORCE-family estimators without a critic: REINFORCE++ and REINFORCE++-baseline (global
normalisation), ReMax (the greedy sample's reward as baseline) and GPG (group mean with GPG's
correction factor)."""

from __future__ import annotations

import torch
from torch import Tensor

from polyrl.algos.advantages.common import (
    advantage_metrics,
    broadcast_to_tokens,
    scored_mask,
    sequence_rewards,
    token_rewards,
    unscored_rows,
)
from polyrl.algos.advantages.gae import generalized_advantage_estimation
from polyrl.algos.advantages.group import _group_metrics, _group_result
from polyrl.algos.advantages.registry import AdvantageInputs, register_advantage
from polyrl.algos.groups import group_mean_std
from polyrl.algos.losses import masked_mean, zero_masked
from polyrl.algos.params import Params, flag, number

_REINFORCE_PP_PAPER = (
    "Hu et al., REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models, arXiv 2501.03262"
)


def global_whiten(x: Tensor, mask: Tensor, *, eps: float = 1e-8) -> Tensor:
    """``(x - mean) * rsqrt(var + eps)`` over the response tokens of the whole batch (unbiased
    variance), 0 off the response.

    The epsilon sits inside the square root, as in verl's ``masked_whiten``: in a batch whose values
    all agree, ``x - mean`` is rounding noise, scaled by ``1/sqrt(eps)`` here (about 0 in float32)
    rather than by ``1/eps`` (which would make it of order 0.1).
    """
    mask = mask.bool()
    count = mask.sum()
    mean = masked_mean(x, mask)
    variance = zero_masked((x - mean).square(), mask).sum() / (count - 1).clamp(min=1)
    return zero_masked((x - mean) * torch.rsqrt(variance + eps), mask)


class ReinforcePPParams(Params):
    gamma: float = number(1.0, ge=0, le=1, description="discount of the token-level return (the paper: 1)")


@register_advantage(
    "reinforce_pp",
    description="REINFORCE++: discounted token return (KL in the reward) normalised over the whole batch.",
    paper=_REINFORCE_PP_PAPER,
    params=ReinforcePPParams,
)
def reinforce_pp_advantages(inputs: AdvantageInputs, *, gamma: float = 1.0) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE++ (Hu et al., arXiv 2501.03262): the return ``G_t = sum_{s>=t} gamma^(s-t) r_s``
    of the token rewards, whitened over all response tokens of the batch (global normalisation,
    no per-prompt baseline).

    The token-level KL penalty ``r_t = -beta * (log pi_old - log pi_ref)`` (k1) is folded into the
    rewards by the pipeline when ``train.kl_in_reward`` is on (the ``reinforce_pp`` objective preset
    turns it on); a [B] sequence reward is placed on the last response token. Masked positions
    inside a response are skipped (the return carries across them); verl's loop resets it there,
    which differs only for responses with masked gaps. Unscored rows get 0 and enter no statistic.
    """
    unscored = unscored_rows(inputs.rewards, inputs.mask)
    scored = scored_mask(inputs.mask, unscored)
    finite = torch.where(torch.isnan(inputs.rewards), torch.zeros_like(inputs.rewards), inputs.rewards)
    rewards = token_rewards(finite, inputs.mask)
    # GAE with V = 0 and lambda = 1 is the discounted return: A_t = r_t + gamma * A_next.
    returns, _ = generalized_advantage_estimation(rewards, torch.zeros_like(rewards), scored, gamma, 1.0)
    advantages = global_whiten(returns, scored)
    return advantages, {**advantage_metrics(advantages, scored), "advantage/return_mean": float(masked_mean(returns, scored))}


@register_advantage(
    "reinforce_pp_baseline",
    description="REINFORCE++-baseline: R minus its group mean, then normalised over the whole batch.",
    paper=_REINFORCE_PP_PAPER,
    requires=("group_ids",),
)
def reinforce_pp_baseline_advantages(inputs: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE++-baseline (arXiv 2501.03262): ``R - mean_group`` broadcast to the response tokens,
    then whitened over all response tokens of the batch (so a longer response weighs more in the
    batch statistics, as in verl's ``reinforce_plus_plus_baseline``).

    Deviation from verl: a group of one scored sample gets advantage 0 before whitening (its own
    mean is its baseline); verl subtracts 0 for such a group.
    """
    rewards = sequence_rewards(inputs.rewards, inputs.mask)
    scored_rows = ~torch.isnan(rewards)
    mean, _, _ = group_mean_std(rewards, inputs.require("group_ids"))
    centred = torch.where(scored_rows, rewards - mean, torch.zeros_like(rewards))
    scored = scored_mask(inputs.mask, ~scored_rows)
    advantages = global_whiten(broadcast_to_tokens(centred, inputs.mask), scored)
    return advantages, {**advantage_metrics(advantages, scored), **_group_metrics(rewards, inputs.require("group_ids"))}


@register_advantage(
    "remax",
    description="ReMax: reward minus the reward of the greedy completion of the same prompt.",
    paper="Li et al., ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning "
    "Large Language Models, arXiv 2310.10505",
    requires=("baselines",),
)
def remax_advantages(inputs: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """ReMax (Li et al., arXiv 2310.10505, Algorithm 1): ``A_t = (sum_{s>=t} r_s) - b`` with ``b``
    the reward of the greedy completion of the same prompt (``inputs.baselines`` [B]: the
    collector generates one greedy sample per prompt through the same engine and scores it with
    the same rewards; that sample is not trained on). For a [B] sequence reward every response
    token gets ``R - b``, as verl's ``remax``. A row whose reward or baseline is unscored (NaN) gets 0.
    """
    baselines = inputs.require("baselines").to(inputs.mask.device)
    unscored = unscored_rows(inputs.rewards, inputs.mask) | torch.isnan(baselines)
    scored = scored_mask(inputs.mask, unscored)
    finite = torch.where(torch.isnan(inputs.rewards), torch.zeros_like(inputs.rewards), inputs.rewards)
    rewards = token_rewards(finite, scored)
    to_go = rewards.flip(-1).cumsum(-1).flip(-1)
    safe_baselines = torch.where(torch.isnan(baselines), torch.zeros_like(baselines), baselines)
    advantages = zero_masked(to_go - safe_baselines[:, None].to(to_go.dtype), scored)
    metrics = advantage_metrics(advantages, scored)
    if (~torch.isnan(baselines)).any():
        metrics["advantage/greedy_baseline_mean"] = float(baselines[~torch.isnan(baselines)].mean())
    return advantages, metrics


class GPGParams(Params):
    std_normalize: bool = flag(False, description="F_norm = the group std (+1e-6); false: F_norm = 1, the paper's default")


@register_advantage(
    "gpg",
    description="GPG: alpha * (R - group mean) / F_norm, alpha = B / (B - M) undoing the zero-advantage groups' dilution.",
    paper="Chu et al., GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning, arXiv 2504.02546",
    requires=("group_ids",),
    params=GPGParams,
)
def gpg_advantages(inputs: AdvantageInputs, *, std_normalize: bool = False) -> tuple[Tensor, dict[str, float]]:
    """GPG's corrected advantage (arXiv 2504.02546): ``alpha * (R - mean_group) / F_norm``.

    ``alpha = B / (B - M)``, with B the batch's scored samples and M those in groups whose scored
    rewards all agree (their advantage is 0, so they only dilute a batch-mean loss); with
    ``M = B`` every advantage is 0 and alpha is 1. ``F_norm`` is 1, or the group std with
    ``std_normalize``. Deviation from verl's ``gpg``: verl takes ``alpha = B / (number of nonzero
    rewards)``, which equals the paper's only when exactly the uniform groups' rewards are 0.
    """
    rewards = sequence_rewards(inputs.rewards, inputs.mask)
    group_ids = inputs.require("group_ids")
    scored = ~torch.isnan(rewards)
    mean, std, _ = group_mean_std(rewards, group_ids)
    uniform = scored & (std == 0)
    total, invalid = int(scored.sum()), int(uniform.sum())
    alpha = total / (total - invalid) if total > invalid else 1.0
    centred = torch.where(scored, rewards - mean, torch.zeros_like(rewards))
    if std_normalize:
        centred = centred / (std + 1e-6)
    advantages, metrics = _group_result(alpha * centred, rewards, inputs)
    return advantages, {**metrics, "advantage/gpg_alpha": alpha}
