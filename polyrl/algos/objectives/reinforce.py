"""REINFORCE-style objectives, whose gradient flows through ``log pi`` itself rather than a
clipped ratio: CISPO (a clipped, stop-gradient importance weight) and GPG (plain policy
gradient). Also the PPO-clip registrations whose point is their advantage estimator: RLOO,
REINFORCE++, REINFORCE++-baseline and ReMax."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from polyrl.algos.losses import masked_mean
from polyrl.algos.objectives.common import ObjectiveInputs, token_ratio
from polyrl.algos.objectives.ppo import VERL_DUAL_CLIP, PPOParams, ppo_loss, symmetric_clip
from polyrl.algos.objectives.registry import ObjectiveParams, register_objective
from polyrl.algos.params import number


class CISPOParams(ObjectiveParams):
    clip_low: float | None = number(
        None, ge=0, lt=1, description="lower width of the IS-weight clip (1 - clip_low); null: no lower bound, as the paper"
    )
    clip_high: float = number(
        4.0, ge=0, description="upper width of the IS-weight clip (1 + clip_high); 4 caps the weight at 5, ScaleRL's epsilon_max"
    )


@register_objective(
    "cispo",
    description="CISPO: sg(clip(r)) * A * log pi per token; the clip bounds the weight, never drops a gradient.",
    paper="MiniMax, MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention, arXiv 2506.13585, §3.1",
    default_aggregation="token_mean",
    default_advantage="group_norm",
    params=CISPOParams,
    deviations="the paper does not publish its epsilon_high^IS; the default cap 5 (clip_high 4) is the one ScaleRL "
    "(arXiv 2510.13786) and TRL recommend. TRL's loss_type 'cispo' clips only above, at epsilon_high (an absolute "
    "cap): clip_low null with clip_high = epsilon_high - 1 gives its loss; verl's 'cispo' clips both sides at its "
    "clip_ratio_low/high (set clip_low too). The paper's optional token mask M (Eq. 5) is left out (all ones). "
    "With train.kl_coef > 0 the KL term is added to the loss. Defaults against verl: verl's clip_ratio_low and "
    "clip_ratio_high are both 0.2, so its weight is clipped to [0.8, 1.2] unless they are set (its CISPO example "
    "sets clip_ratio_low 10 and clip_ratio_high 0.2: no lower bound, cap 1.2); here no lower bound and cap 5. "
    "verl's defaults are clip_low 0.2, clip_high 0.2 here; its example's clip_low null, clip_high 0.2.",
)
def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_normalizer: float,
    aggregation: str,
    entropy: Tensor | None = None,
    clip_low: float | None = None,
    clip_high: float = 4.0,
    **shared: Any,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, §3.1): ``-sg(clip(r, 1-clip_low, 1+clip_high)) * A * log pi``.

    The importance weight is clipped and detached, so its clip bounds the size of a token's
    update but never removes the token from the gradient (PPO's clip zeroes the gradient of
    tokens outside the trust region; CISPO keeps the rare high-ratio "fork" tokens learning).
    The loss value carries ``log pi`` (negative), so it is not on PPO's scale; its gradient is
    ``-w * A * grad log pi`` with ``w`` the clipped weight.
    """
    x = ObjectiveInputs.zero_masked(logprobs, old_logprobs, advantages, mask, entropy=entropy,
                                    loss_normalizer=loss_normalizer, aggregation=aggregation, **shared)  # fmt: skip
    ratio = token_ratio(x.logprobs, x.old_logprobs)
    low = 0.0 if clip_low is None else 1.0 - clip_low
    weight = torch.clamp(ratio, min=low, max=1.0 + clip_high).detach()
    per_token = -weight * x.advantages * x.logprobs
    # No token's gradient is zeroed, so the common clip fractions are 0 (bounds 0 and inf); the
    # share of tokens whose weight the clip changed is CISPO's own metric.
    loss, metrics = x.finalize(per_token, ratio=ratio, low_bound=0.0, high_bound=math.inf)
    with torch.no_grad():
        clipped = (ratio.detach() != weight) & x.mask
        metrics["cispo/weight_clip_frac"] = float(masked_mean(clipped.to(ratio.dtype), x.mask))
        metrics["cispo/weight_mean"] = float(masked_mean(weight, x.mask))
    return loss, metrics


@register_objective(
    "gpg",
    description="GPG: plain policy gradient -A * log pi on GPG's corrected group advantage, token mean.",
    paper="Chu et al., GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning, arXiv 2504.02546",
    default_aggregation="token_mean",
    default_advantage="gpg",
    deviations="the loss is -A * log pi with no ratio (as the paper and verl's 'gpg'), so it is on-policy: with "
    "train.updates_per_batch or train.mini_batches > 1 the later steps are not importance-corrected. "
    "The paper uses no KL term (train.kl_coef 0, the default). The gpg advantage's alpha is the paper's B/(B - M) "
    "(B the batch's scored samples, M those in groups whose rewards all agree, whose advantage is 0); verl's 'gpg' "
    "estimator takes alpha = B / (samples with a nonzero reward), which differs whenever a group is uniformly "
    "rewarded at a nonzero value or a mixed group holds a zero reward: with 0/1 rewards and groups {1, 0} and "
    "{0, 0}, the paper's alpha is 4/2 = 2 and verl's 4/1 = 4.",
)
def gpg_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_normalizer: float,
    aggregation: str,
    entropy: Tensor | None = None,
    **shared: Any,
) -> tuple[Tensor, dict[str, float]]:
    """GPG (Chu et al., arXiv 2504.02546): the policy-gradient loss ``-A * log pi`` per token,
    aggregated over the batch's tokens; the correction factor lives in the ``gpg`` estimator."""
    x = ObjectiveInputs.zero_masked(logprobs, old_logprobs, advantages, mask, entropy=entropy,
                                    loss_normalizer=loss_normalizer, aggregation=aggregation, **shared)  # fmt: skip
    ratio = token_ratio(x.logprobs, x.old_logprobs)
    per_token = -x.advantages * x.logprobs
    return x.finalize(per_token, ratio=ratio, low_bound=0.0, high_bound=math.inf)


# RLOO (Ahmadian et al., arXiv 2402.14740): REINFORCE with the leave-one-out baseline. The paper
# treats the whole completion as one action, -A_i * log pi(y_i | x) = -A_i * sum_t log pi_t, averaged
# over samples: seq_mean_token_sum. At one update per batch the ratio is 1 and PPO-clip's gradient
# is exactly REINFORCE's; the clip only acts on later passes over the same batch.
register_objective(
    "rloo",
    description="RLOO: REINFORCE with the leave-one-out group baseline, sequence log-prob (token sum) per sample.",
    paper="Ahmadian et al., Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human "
    "Feedback in LLMs, arXiv 2402.14740, §3",
    default_aggregation="seq_mean_token_sum",
    default_advantage="rloo",
    params=PPOParams,
    preset_clip=symmetric_clip,
    deviations="the surrogate is PPO-clip (equal to REINFORCE at one update per batch; the clip only acts on reused "
    "batches); the paper's KL penalty in the reward is off by default (set train.kl_coef and train.kl_in_reward); "
    "TRL's and verl's RLOO normalise per token instead (objective.aggregation token_mean). Against verl: " + VERL_DUAL_CLIP,
)(ppo_loss)

register_objective(
    "reinforce_pp",
    description="REINFORCE++: PPO-clip on globally normalised token returns with the k1 KL folded into the reward.",
    paper="Hu et al., REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models, arXiv 2501.03262",
    default_aggregation="token_mean",
    default_advantage="reinforce_pp",
    params=PPOParams,
    preset_clip=symmetric_clip,
    deviations="the KL in the reward is the config's train.kl_in_reward with train.kl_estimator k1 and train.kl_coef "
    "(the objective preset sets true / k1 / 0.01 unless the YAML says otherwise; kl_coef 0 means no KL and "
    "no reference model). The return G_t = sum_{s>=t} gamma^(s-t) r_s skips masked positions inside a response "
    "(an environment's observation tokens) and carries across them, so a token before an observation still gets "
    "the reward paid after it; verl's 'reinforce_plus_plus' zeroes its running return at every masked position, so "
    "there such a token gets only the rewards before the observation (the same for responses without masked "
    "positions). Against verl: " + VERL_DUAL_CLIP,
)(ppo_loss)

register_objective(
    "reinforce_pp_baseline",
    description="REINFORCE++-baseline: PPO-clip on (R - group mean) normalised over the whole batch.",
    paper="Hu et al., REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models, arXiv 2501.03262",
    default_aggregation="token_mean",
    default_advantage="reinforce_pp_baseline",
    params=PPOParams,
    preset_clip=symmetric_clip,
    deviations="the paper puts the KL for this variant in the loss (k2/k3); here that is train.kl_coef with "
    "train.kl_estimator, 0 by default (no reference model). Against verl: " + VERL_DUAL_CLIP,
)(ppo_loss)

register_objective(
    "remax",
    description="ReMax: REINFORCE with the greedy completion's reward as the baseline (one extra greedy sample per prompt).",
    paper="Li et al., ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning Large "
    "Language Models, arXiv 2310.10505",
    default_aggregation="seq_mean_token_mean",
    default_advantage="remax",
    params=PPOParams,
    preset_clip=symmetric_clip,
    deviations="the surrogate is PPO-clip (equal to REINFORCE at one update per batch); the collector samples "
    "rollout.samples_per_prompt completions per prompt (the paper: one) plus the greedy one, which is scored "
    "but never trained on; verl's 'remax' likewise. Against verl: " + VERL_DUAL_CLIP,
)(ppo_loss)
