"""Advantage estimators: pure tensor functions registered by name.

Uniform call shape. Every registered estimator is called with keyword arguments only::

    advantages, metrics = spec.fn(
        rewards=rewards,      # [B] sequence rewards or [B, T] token rewards (see below)
        mask=mask,            # [B, T], 1 on response tokens
        group_ids=group_ids,  # [B] ints, equal for the G samples of one prompt (or None)
        values=values,        # [B, T] value-head predictions (or None)
        gammas=gammas,        # [B, T] per-token discount, each token's modality setting (or None)
        lambdas=lambdas,      # [B, T] per-token GAE lambda (or None)
        **params,             # spec.default_params overridden by config
    )

The learner passes every tensor it has (``None`` for the rest); each estimator uses what it
needs and raises ``ValueError`` naming a required tensor that is missing
(``spec.requires`` lists them up front, e.g. to decide whether a value head is needed).
Unknown ``params`` raise ``TypeError``. ``advantages`` is [B, T] and zero off the response.
Each registration declares its params as a typed model (``spec.params``, see
:mod:`polyrl.algos.params`), checked at config load; ``spec.default_params`` holds its defaults.

Rewards of either shape are accepted by every estimator: sequence estimators sum [B, T] token
rewards over response tokens; GAE places [B] sequence rewards on each row's last response token.

Unscored samples: a NaN reward (in a [B] reward, or on any response token of a [B, T] row)
marks a sample the reward modules could not score. It is left out of every statistic (group
mean, std and leave-one-out baseline, batch std, whitening) and its advantage is 0; GAE's value
target for it is its own value (advantage 0). Metrics cover scored samples only.

Estimators that train a critic set ``spec.value_targets``: a function with the same call shape
returning ``(returns [B, T], metrics)``, the targets for the value loss (``returns = A + V``
before any whitening).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import torch
from pydantic import Field
from torch import Tensor

from polyrl.algos.dapo_data import dapo_dynamic_sampling_keep, dapo_overlong_penalty  # noqa: F401 - re-exported
from polyrl.algos.losses import masked_mean, zero_masked
from polyrl.algos.params import Params, flag, number, param_defaults, validate_params

AdvantageFn = Callable[..., tuple[Tensor, dict[str, float]]]

_TENSOR_ARGUMENTS = ("rewards", "mask", "group_ids", "values", "gammas", "lambdas")
STD_SCALES: tuple[str, ...] = ("group", "batch")


@dataclass(frozen=True)
class AdvantageSpec:
    name: str
    fn: AdvantageFn
    description: str
    paper: str
    requires: tuple[str, ...] = ()
    value_targets: AdvantageFn | None = None
    params: type[Params] = Params
    default_params: dict[str, Any] = field(default_factory=dict)

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """User ``params`` as proper Python values; a pydantic ``ValidationError`` otherwise."""
        return validate_params(self.params, params, owner=f"advantage estimator {self.name!r}")


_ADVANTAGES: dict[str, AdvantageSpec] = {}


def register_advantage(
    name: str,
    *,
    description: str,
    paper: str,
    requires: tuple[str, ...] = (),
    value_targets: AdvantageFn | None = None,
    params: type[Params] = Params,
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an estimator with its typed ``params`` model (the defaults live there)."""
    unknown = set(requires) - set(_TENSOR_ARGUMENTS)
    if unknown:
        raise ValueError(f"requires names unknown tensors {sorted(unknown)}; known: {_TENSOR_ARGUMENTS}")

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        if name in _ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        accepted = set(inspect.signature(fn).parameters) - set(_TENSOR_ARGUMENTS)
        if set(params.model_fields) - accepted:
            raise ValueError(f"advantage estimator {name!r}: fn must accept {sorted(set(params.model_fields) - accepted)}")
        _ADVANTAGES[name] = AdvantageSpec(
            name=name,
            fn=fn,
            description=description,
            paper=paper,
            requires=("rewards", "mask", *requires),
            value_targets=value_targets,
            params=params,
            default_params=param_defaults(params),
        )
        return fn

    return decorator


def get_advantage(name: str) -> AdvantageSpec:
    if name not in _ADVANTAGES:
        raise ValueError(
            f"unknown advantage estimator {name!r}; registered estimators: {', '.join(_ADVANTAGES)}"
        )
    return _ADVANTAGES[name]


def list_advantages() -> list[AdvantageSpec]:
    return list(_ADVANTAGES.values())


# ---------------------------------------------------------------------------------------------
# Reward shapes


def _require(name: str, tensor: Tensor | None) -> Tensor:
    if tensor is None:
        raise ValueError(f"this advantage estimator needs the {name!r} tensor")
    return tensor


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


def _scored_mask(mask: Tensor, unscored: Tensor) -> Tensor:
    return mask.bool() & ~unscored[:, None]


def _advantage_metrics(advantages: Tensor, mask: Tensor) -> dict[str, float]:
    mask = mask.bool()
    mean = masked_mean(advantages, mask)
    variance = masked_mean((advantages - mean).square(), mask)
    return {
        "advantage/mean": float(mean),
        "advantage/std": float(variance.sqrt()),
        "advantage/abs_max": float(zero_masked(advantages, mask).abs().max()) if mask.any() else 0.0,
    }


# ---------------------------------------------------------------------------------------------
# Group statistics


def group_mean_std(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample ``(group mean, group std, group size)`` [B] each, over the group's SCORED
    samples (NaN rewards are left out; ``size`` counts the scored ones).

    The std is the unbiased (Bessel-corrected, ``torch.std``'s default) estimate, as in the
    reference GRPO implementations that call ``torch.std``; groups of one scored sample get
    std 0, groups with none get mean 0.
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    scored = ~torch.isnan(rewards)
    safe = torch.where(scored, rewards, torch.zeros_like(rewards))
    sums = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device).index_add_(0, inverse, safe)
    counts = torch.zeros_like(sums).index_add_(0, inverse, scored.to(rewards.dtype))
    mean = (sums / counts.clamp(min=1))[inverse]
    deviations = torch.where(scored, (safe - mean).square(), torch.zeros_like(safe))
    squared = torch.zeros_like(sums).index_add_(0, inverse, deviations)
    size = counts[inverse]
    variance = torch.where(size > 1, squared[inverse] / (size - 1).clamp(min=1), torch.zeros_like(mean))
    return mean, variance.sqrt(), size


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
    *,
    rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gammas: Tensor | None = None,
    lambdas: Tensor | None = None,
    use_std: bool = True,
    std_scale: str = "group",
    eps: float = 1e-6,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO's outcome advantage (Shao et al., "DeepSeekMath", arXiv 2402.03300, §4.1.2).

    Deviations: the unbiased group std (the paper does not say which), and the optional
    ``std_scale='batch'`` / ``use_std=False`` variants.
    """
    rewards = sequence_rewards(rewards, mask)
    group_ids = _require("group_ids", group_ids)
    advantages = broadcast_to_tokens(
        group_normalized(rewards, group_ids, use_std=use_std, std_scale=std_scale, eps=eps), mask
    )
    scored_mask = _scored_mask(mask, torch.isnan(rewards))
    return advantages, {**_advantage_metrics(advantages, scored_mask), **_group_metrics(rewards, group_ids)}


@register_advantage(
    "group_mean_centered",
    description="Dr.GRPO advantage R - group mean (no std division), broadcast to tokens.",
    paper="Liu et al., Understanding R1-Zero-Like Training: A Critical Perspective, arXiv 2503.20783",
    requires=("group_ids",),
)
def group_mean_centered_advantages(
    *,
    rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gammas: Tensor | None = None,
    lambdas: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Dr.GRPO's advantage ``R - mean_group`` (arXiv 2503.20783): dividing by the group std
    up-weights questions that are too easy or too hard, so it is dropped. No deviations."""
    return group_norm_advantages(rewards=rewards, mask=mask, group_ids=group_ids, use_std=False)


@register_advantage(
    "rloo",
    description="REINFORCE leave-one-out: R_i minus the mean of the other samples of its group.",
    paper="Ahmadian et al., Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs, arXiv 2402.14740",
    requires=("group_ids",),
)
def rloo_advantages(
    *,
    rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gammas: Tensor | None = None,
    lambdas: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """RLOO: ``A_i = R_i - (sum_group - R_i) / (G - 1)``.

    Kool et al., "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (ICLR 2019 workshop);
    Ahmadian et al., arXiv 2402.14740. Deviation: a group of one scored sample gets advantage 0
    (there is no other sample to form a baseline from).
    """
    rewards = sequence_rewards(rewards, mask)
    group_ids = _require("group_ids", group_ids)
    scored = ~torch.isnan(rewards)
    mean, _, size = group_mean_std(rewards, group_ids)  # over scored samples; size counts them
    others_mean = (mean * size - rewards) / (size - 1).clamp(min=1)
    sequence_advantage = torch.where(scored & (size > 1), rewards - others_mean, torch.zeros_like(rewards))
    advantages = broadcast_to_tokens(sequence_advantage, mask)
    scored_mask = _scored_mask(mask, ~scored)
    return advantages, {**_advantage_metrics(advantages, scored_mask), **_group_metrics(rewards, group_ids)}


# ---------------------------------------------------------------------------------------------
# GAE


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
    - Each token uses its own ``gamma_t``/``lambda_t`` (its modality's setting, seed ``003`` §7),
      both for discounting the next value and for the trace.
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
    mask = mask.bool()
    count = mask.sum()
    mean = masked_mean(x, mask)
    variance = zero_masked((x - mean).square(), mask).sum() / (count - 1).clamp(min=1)
    return zero_masked((x - mean) / (variance.sqrt() + eps), mask)


def _scored_gae(rewards: Tensor, mask: Tensor, values: Tensor | None, gammas: Tensor | None,
                lambdas: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """GAE over the scored rows only: ``(advantages, returns, scored_mask)``. Unscored rows
    (NaN reward) get advantage 0 and their own values as returns (A + V with A = 0)."""
    values = _require("values", values)
    unscored = unscored_rows(rewards, mask)
    scored_mask = _scored_mask(mask, unscored)
    finite_rewards = torch.where(torch.isnan(rewards), torch.zeros_like(rewards), rewards)
    advantages, returns = generalized_advantage_estimation(
        token_rewards(finite_rewards, mask), values, scored_mask, _require("gammas", gammas), _require("lambdas", lambdas)
    )
    returns = torch.where(mask.bool() & unscored[:, None], values.detach(), returns)
    return advantages, returns, scored_mask


def gae_value_targets(
    *,
    rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gammas: Tensor | None = None,
    lambdas: Tensor | None = None,
    whiten: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """Value-loss targets ``A + V`` of :func:`generalized_advantage_estimation` (never whitened);
    an unscored row's target is its own value."""
    _, returns, scored_mask = _scored_gae(rewards, mask, values, gammas, lambdas)
    return returns, {"value/returns_mean": float(masked_mean(returns, scored_mask))}


class GAEParams(Params):
    whiten: bool = flag(False, description="whiten advantages over the batch's response tokens (seed 000 §3.1)")


@register_advantage(
    "gae",
    description="Generalized advantage estimation with per-token gamma/lambda and a value head.",
    paper="Schulman et al., High-Dimensional Continuous Control Using Generalized Advantage Estimation, arXiv 1506.02438",
    requires=("values", "gammas", "lambdas"),
    value_targets=gae_value_targets,
    params=GAEParams,
)
def gae_advantages(
    *,
    rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gammas: Tensor | None = None,
    lambdas: Tensor | None = None,
    whiten: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """GAE advantages (see :func:`generalized_advantage_estimation`), optionally whitened over
    the batch's response tokens (seed ``000`` §3.1 normalises GAE advantages this way).
    Unscored rows get 0 and are left out of the whitening statistics."""
    advantages, _, scored_mask = _scored_gae(rewards, mask, values, gammas, lambdas)
    if whiten:
        advantages = masked_whiten(advantages, scored_mask)
    return advantages, _advantage_metrics(advantages, scored_mask)
