"""Generalized advantage estimation with a value head and a per-token gamma/lambda."""

from __future__ import annotations

import torch
from torch import Tensor

from polyrl.algos.advantages.common import advantage_metrics, scored_mask, token_rewards, unscored_rows
from polyrl.algos.advantages.registry import AdvantageInputs, register_advantage
from polyrl.algos.losses import masked_mean, masked_mean_std, zero_masked
from polyrl.algos.params import Params, flag


def _as_token_tensor(setting: Tensor | float, like: Tensor) -> Tensor:
    return torch.as_tensor(setting, dtype=like.dtype, device=like.device).expand_as(like)


def generalized_advantage_estimation(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gammas: Tensor | float,
    lambdas: Tensor | float,
) -> tuple[Tensor, Tensor]:
    """GAE with a per-token gamma and lambda; returns ``(advantages, returns)`` [B, T] each.

    Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", arXiv 1506.02438: ``delta_t = r_t + gamma_t V(next) - V_t``,
    ``A_t = delta_t + gamma_t lambda_t A(next)``, ``returns = A + V``.

    Deviations / choices:
    - Each token uses its own ``gamma_t``/``lambda_t`` (its modality's setting: per-modality
      γ/λ is polyrl's own design, not the paper's), both for discounting the next value and for
      the trace.
    - "next" is the next RESPONSE token of the row: masked positions (padding, or tool/image
      tokens inside the response) are skipped, carrying V and A across them, and their
      rewards and values are ignored. After the last response token the episode ends (V=0;
      no bootstrap for truncated responses).
    - Values are detached; results are 0 off the response.
    Scalars are accepted for ``gammas``/``lambdas`` and broadcast.
    """
    mask = mask.bool()
    rewards = zero_masked(token_rewards.detach(), mask)
    values = zero_masked(values.detach(), mask)
    gammas = zero_masked(_as_token_tensor(gammas, rewards), mask)
    lambdas = zero_masked(_as_token_tensor(lambdas, rewards), mask)

    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    columns: list[Tensor] = []
    for t in reversed(range(rewards.shape[-1])):
        is_response = mask[:, t]
        delta = rewards[:, t] + gammas[:, t] * next_value - values[:, t]
        advantage = delta + gammas[:, t] * lambdas[:, t] * next_advantage
        columns.append(torch.where(is_response, advantage, torch.zeros_like(advantage)))
        next_value = torch.where(is_response, values[:, t], next_value)
        next_advantage = torch.where(is_response, advantage, next_advantage)
    advantages = torch.stack(columns[::-1], dim=-1)
    returns = zero_masked(advantages + values, mask)
    return advantages, returns


def masked_whiten(x: Tensor, mask: Tensor, *, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / (std + eps)`` over response tokens (unbiased std); 0 off the response."""
    mean, std = masked_mean_std(x, mask, unbiased=True)
    return zero_masked((x - mean) / (std + eps), mask)


def _scored_gae(inputs: AdvantageInputs) -> tuple[Tensor, Tensor, Tensor]:
    """GAE over the scored rows only: ``(advantages, returns, scored_mask)``. Unscored rows
    (NaN reward) get advantage 0 and their own values as returns (A + V with A = 0)."""
    rewards, mask, values = inputs.rewards, inputs.mask, inputs.require("values")
    unscored = unscored_rows(rewards, mask)
    scored = scored_mask(mask, unscored)
    finite_rewards = torch.where(torch.isnan(rewards), torch.zeros_like(rewards), rewards)
    advantages, returns = generalized_advantage_estimation(
        token_rewards(finite_rewards, mask), values, scored, inputs.require("gammas"), inputs.require("lambdas")
    )
    returns = torch.where(mask.bool() & unscored[:, None], values.detach(), returns)
    return advantages, returns, scored


def gae_value_targets(inputs: AdvantageInputs, *, whiten: bool = False) -> tuple[Tensor, dict[str, float]]:
    """Value-loss targets ``A + V`` of :func:`generalized_advantage_estimation` (never whitened);
    an unscored row's target is its own value."""
    _, returns, scored = _scored_gae(inputs)
    return returns, {"value/returns_mean": float(masked_mean(returns, scored))}


class GAEParams(Params):
    whiten: bool = flag(
        False,
        description="whiten advantages over the batch's response tokens (as PPO implementations such as verl's and TRL's do)",
    )


@register_advantage(
    "gae",
    description="Generalized advantage estimation with per-token gamma/lambda and a value head.",
    paper="Schulman et al., High-Dimensional Continuous Control Using Generalized Advantage Estimation, arXiv 1506.02438",
    requires=("values", "gammas", "lambdas"),
    value_targets=gae_value_targets,
    params=GAEParams,
)
def gae_advantages(inputs: AdvantageInputs, *, whiten: bool = False) -> tuple[Tensor, dict[str, float]]:
    """GAE advantages (see :func:`generalized_advantage_estimation`), optionally whitened over
    the batch's response tokens (the advantage normalisation of common PPO implementations, e.g.
    verl's and TRL's; neither the GAE paper, arXiv 1506.02438, nor PPO's, arXiv 1707.06347,
    prescribes it).
    Unscored rows get 0 and are left out of the whitening statistics."""
    advantages, _, scored = _scored_gae(inputs)
    if whiten:
        advantages = masked_whiten(advantages, scored)
    return advantages, advantage_metrics(advantages, scored)
