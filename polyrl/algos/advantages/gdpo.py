"""GDPO: each reward normalised within its group apart from the others, then the weighted sum,
then one batch-wide normalisation (``advantage.reward_aggregation: gdpo``).

Liu et al., "GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL
Optimization", arXiv 2601.05242, §3. With several rewards GRPO normalises their weighted total
within the group, so different reward combinations can collapse into the same advantage: with
two binary rewards and two samples, the totals (0, 1) and (0, 2) both give (-0.71, +0.71),
although the second sample of the second group passed both checks. GDPO normalises each reward
``k`` within the group first::

    A_k = (r_k - mean_group(r_k)) / (std_group(r_k) + eps)
    A_sum = sum_k w_k * A_k
    A = (A_sum - mean_batch(A_sum)) / (std_batch(A_sum) + eps)

The last step keeps the advantage's scale from growing with the number of rewards.

Conventions, and where the reference implementations differ:

- std: unbiased (Bessel), as polyrl's ``group_norm`` and TRL's ``nanstd``; ``eps`` outside the
  square root, both steps (``group_norm``'s ``eps`` param, default 1e-6; TRL uses 1e-4).
- The batch step is over samples (the paper's formula, TRL's ``normalize_then_sum``); the
  authors' verl version (NVlabs/GDPO) whitens over response tokens instead, so a longer
  response weighs more in the batch mean and std, and sums the rewards without weights.
- A reward that is constant within a group gives 0 there exactly (tested as max == min, not
  through a rounded std), whatever ``eps``.
- Unscored samples: a sample that any reward left unscored (NaN) is unscored, as its total would
  be (:mod:`polyrl.rewards.composite`): advantage 0 and left out of every statistic. TRL keeps a
  sample that some reward scored and counts the missing term as 0 after normalisation.
- Which estimators: only ``group_norm`` with the group std. Centring alone is linear (Dr.GRPO,
  RLOO, GPG, REINFORCE++-baseline), so centring each reward and summing equals centring the sum;
  GAE's critic learns the value of the total; neither has anything to decouple
  (:func:`polyrl.config.objective.check_reward_aggregation` refuses the others).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from polyrl.algos.advantages.common import advantage_metrics, broadcast_to_tokens, scored_mask
from polyrl.algos.groups import group_index, group_mean_std

# advantage.reward_aggregation's values: 'sum' (the estimator sees the weighted total) or 'gdpo'.
REWARD_AGGREGATIONS: tuple[str, ...] = ("sum", "gdpo")
# The estimators whose advantage depends on how the rewards are combined before it (see above).
GDPO_ESTIMATORS: tuple[str, ...] = ("group_norm",)


def reward_components(per_module: Mapping[str, Sequence[float | None]], labels: Sequence[str]) -> Tensor:
    """[B, K] float32 raw scores of the rewards ``labels`` (in that order); None becomes NaN."""
    missing = [label for label in labels if label not in per_module]
    if missing:
        raise ValueError(f"reward_aggregation 'gdpo' needs each reward's scores, but {missing} have none")
    columns = [[float("nan") if v is None else float(v) for v in per_module[label]] for label in labels]
    return torch.tensor(columns, dtype=torch.float32).T.reshape(-1, len(labels))


def _constant_in_group(values: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """``(per sample [B], per group [G])``: whether the group's scored values all agree (NaN: unscored)."""
    inverse, num_groups = group_index(group_ids)
    scored = ~torch.isnan(values)
    high = torch.full((num_groups,), -torch.inf, dtype=values.dtype).scatter_reduce(
        0, inverse, torch.where(scored, values, -torch.inf), reduce="amax"
    )
    low = torch.full((num_groups,), torch.inf, dtype=values.dtype).scatter_reduce(
        0, inverse, torch.where(scored, values, torch.inf), reduce="amin"
    )
    constant = high <= low  # one scored value, or all equal (a group with none: +inf <= -inf is False)
    return constant[inverse], constant


def decoupled_group_normalized(components: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> tuple[Tensor, Tensor, Tensor]:
    """``(A_k [B, K], scored [B], constant [B, K])``: each reward's ``(r_k - mean) / (std + eps)``
    within its group over the scored samples, 0 where the reward is constant in the group and on
    unscored samples."""
    scored = ~torch.isnan(components).any(dim=-1)
    # A sample unscored by any reward is out of every reward's statistics (as its total would be).
    values = torch.where(scored[:, None], components, torch.full_like(components, float("nan")))
    normalized, constant = torch.zeros_like(values), torch.zeros(values.shape, dtype=torch.bool)
    for k in range(values.shape[-1]):
        mean, std, _ = group_mean_std(values[:, k], group_ids)
        constant[:, k], _ = _constant_in_group(values[:, k], group_ids)
        moving = scored & ~constant[:, k]
        normalized[:, k] = torch.where(moving, (values[:, k] - mean) / (std + eps), torch.zeros_like(mean))
    return normalized, scored, constant


def gdpo_sequence_advantages(
    components: Tensor, weights: Sequence[float], group_ids: Tensor, *, eps: float = 1e-6
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(A [B], A_k [B, K], A_sum [B], scored [B])`` of GDPO (module docstring) for ``components``
    [B, K] (NaN: unscored) and one weight per column."""
    if components.dim() != 2 or components.shape[-1] != len(weights):
        raise ValueError(f"components must be [B, K] with K = {len(weights)} weights, got {tuple(components.shape)}")
    per_reward, scored, _ = decoupled_group_normalized(components, group_ids, eps=eps)
    weight = torch.tensor([float(w) for w in weights], dtype=per_reward.dtype)
    combined = (per_reward * weight).sum(dim=-1)
    picked = combined[scored]
    if picked.numel() > 1:
        mean, std = picked.mean(), picked.std()
    else:  # one scored sample: its advantage is 0, as a group of one's
        mean, std = (picked.mean() if picked.numel() else combined.new_zeros(())), combined.new_zeros(())
    advantages = torch.where(scored, (combined - mean) / (std + eps), torch.zeros_like(combined))
    return advantages, per_reward, combined, scored


def gdpo_advantages(
    per_module: Mapping[str, Sequence[float | None]],
    weights: Mapping[str, float],
    group_ids: Tensor,
    mask: Tensor,
    *,
    eps: float = 1e-6,
) -> tuple[Tensor, dict[str, float]]:
    """GDPO advantages [B, T] (broadcast to the response tokens) and their metrics, from each reward's
    raw scores (``Scores.per_module``) and weights (``rewards[].weight``, by label).

    Metrics: the estimator's usual ``advantage/{mean,std,abs_max}`` and
    ``advantage/uniform_group_sample_frac`` (share of scored samples whose group no reward
    separates), and per reward ``advantage/<label>/std`` (std over the batch of its group-normalised
    term before weighting) and ``advantage/<label>/constant_group_share`` (share of the groups with
    a scored sample in which it is constant: no signal from it there);
    ``advantage/gdpo_sum_std`` is the batch std the weighted sum was divided by.
    """
    labels = list(weights)
    components = reward_components(per_module, labels)
    sequence, per_reward, combined, scored = gdpo_sequence_advantages(
        components, [weights[label] for label in labels], group_ids, eps=eps
    )
    advantages = broadcast_to_tokens(sequence, mask)
    metrics = advantage_metrics(advantages, scored_mask(mask, ~scored))
    values = torch.where(scored[:, None], components, torch.full_like(components, float("nan")))
    constant_everywhere = torch.ones_like(scored)
    for k, label in enumerate(labels):
        per_sample, per_group = _constant_in_group(values[:, k], group_ids)
        constant_everywhere &= per_sample
        inverse, num_groups = group_index(group_ids)
        has_scored = torch.zeros(num_groups, dtype=torch.bool).index_fill_(0, inverse[scored], True)
        metrics[f"advantage/{label}/std"] = float(per_reward[scored, k].std()) if int(scored.sum()) > 1 else 0.0
        metrics[f"advantage/{label}/constant_group_share"] = float(
            per_group[has_scored].float().mean() if has_scored.any() else torch.tensor(0.0)
        )
    metrics["advantage/uniform_group_sample_frac"] = float(
        (constant_everywhere & scored).float().sum() / scored.sum().clamp(min=1)
    )
    metrics["advantage/gdpo_sum_std"] = float(combined[scored].std()) if int(scored.sum()) > 1 else 0.0
    return advantages, metrics
