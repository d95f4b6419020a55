"""BAPO: PPO-clip with adaptive bounds balancing positive and negative contributions.

Xi et al., "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy
Optimization with Adaptive Clipping", arXiv 2510.18927, plus two options of polyrl's own (not
in the paper).
The bound search is a batch-level choice: :func:`bapo_prepare` runs it once per mini-batch (the
trainer calls the registration's ``prepare`` before its micro-batch loop) and every micro-batch
call of :func:`bapo_loss` receives the same bounds, so the update does not depend on the split.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import model_validator
from torch import Tensor

from polyrl.algos.losses import masked_mean
from polyrl.algos.objectives.common import (
    ObjectiveInputs,
    clipped_surrogate_per_token,
    kept_contributions,
    token_ratio,
    zero_masked_inputs,
)
from polyrl.algos.objectives.registry import ObjectiveParams, register_objective
from polyrl.algos.params import flag, number

_BAPO_PAPER = (
    "Xi et al., BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced "
    "Policy Optimization with Adaptive Clipping, arXiv 2510.18927"
)

# Params that only act while the option they belong to is on; setting them with the option off
# would do nothing, so it is refused.
_OPTION_PARAMS: dict[tuple[str, bool], tuple[str, ...]] = {
    ("bound_search", True): ("c_low_max", "c_high_max", "c_low_step", "c_high_step", "target_positive_share"),
    ("entropy_adaptive_clip", True): ("clip_eps_base", "entropy_clip_alpha", "entropy_target"),
    ("positive_weight_sigmoid", True): ("positive_weight_target", "positive_weight_beta", "positive_weight_sign"),
    ("entropy_adaptive_clip", False): ("c_low_start", "c_high_start"),
}


class BAPOParams(ObjectiveParams):
    c_low_start: float = number(0.6, gt=0, lt=1, description="lower ratio bound where the search starts")
    c_low_max: float = number(0.9, gt=0, lt=1, description="highest lower bound the search may reach")
    c_high_start: float = number(1.2, gt=1, description="upper ratio bound where the search starts")
    c_high_max: float = number(3.0, gt=1, description="highest upper bound the search may reach")
    c_low_step: float = number(0.05, gt=0, description="raise of the lower bound per search step")
    c_high_step: float = number(0.1, gt=0, description="raise of the upper bound per search step")
    target_positive_share: float = number(0.5, ge=0, le=1, description="rho_0: positive share of the loss the search aims for")
    bound_search: bool = flag(True, description="search the bounds every mini-batch; false: use the start bounds")
    dual_clip: float | None = number(
        None, gt=1, description="dual-clip c (> 1) for A<0 tokens; null = off (the authors' recipe uses 3)"
    )
    entropy_adaptive_clip: bool = flag(
        False, description="polyrl's own option (not in the paper): start bounds 1 -/+ eps_t from the mini-batch entropy"
    )
    clip_eps_base: float = number(0.2, ge=0, lt=1, description="eps_base of the entropy-adaptive epsilon")
    entropy_clip_alpha: float = number(
        0.2, description="alpha of the entropy-adaptive epsilon (negative: wider bounds at high entropy)"
    )
    entropy_target: float = number(1.5, ge=0, description="H_target of the entropy-adaptive epsilon (nats)")
    positive_weight_sigmoid: bool = flag(
        False, description="polyrl's own option (not in the paper): weight A>0 tokens by sigmoid(sign*beta*(C - C_target))"
    )
    positive_weight_target: float = number(0.45, ge=0, le=1, description="C_target of the positive weight")
    positive_weight_beta: float = number(5.0, ge=0, description="beta of the positive weight")
    positive_weight_sign: float = number(1.0, description="+1: away from balance (as first drafted), -1: towards balance")

    @model_validator(mode="after")
    def _consistent(self) -> "BAPOParams":
        if self.positive_weight_sign not in (1.0, -1.0):
            raise ValueError(f"positive_weight_sign must be 1 or -1, got {self.positive_weight_sign}")
        if self.c_low_start > self.c_low_max or self.c_high_start > self.c_high_max:
            raise ValueError("the search starts below its maxima: need c_low_start <= c_low_max and c_high_start <= c_high_max")
        for (option, needed), names in _OPTION_PARAMS.items():
            idle = sorted(set(names) & self.model_fields_set)
            if getattr(self, option) is not needed and idle:
                state = "on" if needed else "off"
                raise ValueError(f"{', '.join(idle)} only act(s) with {option} {state}; drop them or turn {option} {state}")
        return self


@torch.no_grad()
def bapo_positive_share(ratio: Tensor, advantages: Tensor, mask: Tensor, *, c_low: float, c_high: float) -> float:
    """``pos / (pos + neg)`` of the clipped-surrogate contributions under bounds [c_low, c_high].

    ``pos = sum r*A`` over response tokens with A>0 and ``r <= c_high``; ``neg = sum r*|A|`` over
    response tokens with A<0 and ``r >= c_low``. Tokens outside the bound on the side where PPO
    clipping zeroes their gradient (A>0 above c_high, A<0 below c_low) are excluded; for the
    kept tokens the clipped surrogate equals ``r*A``. Returns 1.0 when ``neg == 0`` (nothing to
    balance, so the search stops). The authors' verl recipe instead counts every token with
    the ratio clamped to the bound (``min(r, c_high)*A`` / ``max(r, c_low)*A``).
    """
    positive, negative = kept_contributions(ratio, advantages, mask, low_bound=c_low, high_bound=c_high)
    if negative <= 0.0:
        return 1.0
    return positive / (positive + negative)


def _raised_bound(start: float, step: float, steps: int, maximum: float) -> float:
    # start + k*step instead of repeated += keeps the grid free of accumulated rounding.
    value = start + steps * step
    return maximum if value >= maximum - 1e-9 else value


def bapo_search_clip_bounds(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    c_low_start: float = 0.6,
    c_low_max: float = 0.9,
    c_high_start: float = 1.2,
    c_high_max: float = 3.0,
    c_low_step: float = 0.05,
    c_high_step: float = 0.1,
    target_positive_share: float = 0.5,
) -> tuple[float, float, float]:
    """BAPO's adaptive clipping search (Algorithm 1 of arXiv 2510.18927); returns
    ``(c_low, c_high, positive_share)``.

    Starting from ``(c_low_start, c_high_start)``, raise ``c_low`` by ``c_low_step`` up to
    ``c_low_max`` (each step drops more low-ratio negative tokens), then raise ``c_high`` by
    ``c_high_step`` up to ``c_high_max`` (each step admits more high-ratio positive tokens),
    stopping as soon as :func:`bapo_positive_share` reaches ``target_positive_share`` (rho_0).
    The last step is shortened to land exactly on the maximum. ``ratio`` and ``advantages`` are
    detached. Defaults are the ranges of the authors' README (c_low in [0.6, 0.9], c_high in
    [1.2, 3.0], rho_0 = 0.5). Deviation: the step sizes are ours.
    """
    if c_low_step <= 0 or c_high_step <= 0:
        raise ValueError("c_low_step and c_high_step must be > 0")

    def share(c_low: float, c_high: float) -> float:
        return bapo_positive_share(ratio, advantages, mask, c_low=c_low, c_high=c_high)

    c_low, c_high = c_low_start, c_high_start
    positive_share = share(c_low, c_high)
    steps = 0
    while positive_share < target_positive_share and c_low < c_low_max:
        steps += 1
        c_low = _raised_bound(c_low_start, c_low_step, steps, c_low_max)
        positive_share = share(c_low, c_high)
    steps = 0
    while positive_share < target_positive_share and c_high < c_high_max:
        steps += 1
        c_high = _raised_bound(c_high_start, c_high_step, steps, c_high_max)
        positive_share = share(c_low, c_high)
    return c_low, c_high, positive_share


def bapo_search_steps(c_low: float, c_high: float, *, c_low_start: float, c_high_start: float,
                      c_low_step: float, c_high_step: float) -> int:  # fmt: skip
    """Number of raises the search made to reach ``(c_low, c_high)`` (the last may be partial)."""
    low_steps = math.ceil((c_low - c_low_start) / c_low_step - 1e-6) if c_low > c_low_start else 0
    high_steps = math.ceil((c_high - c_high_start) / c_high_step - 1e-6) if c_high > c_high_start else 0
    return low_steps + high_steps


def entropy_adaptive_epsilon(mean_entropy: float, *, epsilon_base: float, alpha: float, entropy_target: float) -> float:
    """polyrl's own option (not in the BAPO paper): ``eps_t = eps_base * (1 + alpha * (H_target - H_t))``,
    kept in [0, 0.99].

    With a positive ``alpha`` the clip range widens when entropy falls below the target (the
    DESIGN health check's remedy for collapse); a negative ``alpha`` gives the opposite (wider
    when entropy is high early on, tighter as the policy degenerates).
    """
    epsilon = epsilon_base * (1.0 + alpha * (entropy_target - mean_entropy))
    return min(max(epsilon, 0.0), 0.99)


def positive_weight(actual_share: float, *, target_share: float, beta: float, sign: float) -> float:
    """polyrl's own option (not in the BAPO paper): ``lambda_pos = sigmoid(sign * beta * (C_actual - C_target))``.

    With ``sign=+1`` (the default, as first drafted) lambda_pos grows when positive contributions
    already exceed the target, which pushes further from balance; ``sign=-1`` is the balancing
    direction.
    """
    return 1.0 / (1.0 + math.exp(-sign * beta * (actual_share - target_share)))


@torch.no_grad()
def bapo_prepare(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    entropy: Tensor | None = None,
    **params: Any,
) -> dict[str, Any]:
    """BAPO's batch-level choices over a whole mini-batch [B, T] (no gradient).

    Returns ``{"clip_bounds": (c_low, c_high), "positive_share": float, "search_steps": int,
    "share_measured": bool}`` (``share_measured``: some token contributes at the chosen bounds, so
    the share is a measured balance rather than the search's stopping value 1.0)
    plus ``"clip_eps"`` with ``entropy_adaptive_clip``: the entropy-adaptive start bounds use the
    mini-batch's mean entropy, the search (or the fixed start bounds) the mini-batch's ratios,
    and ``positive_share`` (at the chosen bounds) feeds the sigmoid positive weight. Pass the
    dict as extra keywords to :func:`bapo_loss` on each micro-batch of that mini-batch.
    ``params`` are the objective's (:class:`BAPOParams`, whose defaults fill the missing ones);
    other keywords (the ``train.*`` settings the learner passes to every hook) are ignored.
    """
    p = BAPOParams.model_construct(**{name: value for name, value in params.items() if name in BAPOParams.model_fields})
    logprobs, old_logprobs, advantages, mask, entropy = zero_masked_inputs(
        logprobs.detach(), old_logprobs, advantages, mask, entropy
    )
    ratio = token_ratio(logprobs, old_logprobs)
    state: dict[str, Any] = {}
    c_low_start, c_high_start = p.c_low_start, p.c_high_start
    if p.entropy_adaptive_clip:
        if entropy is None:
            raise ValueError("entropy_adaptive_clip needs the per-token entropy tensor")
        epsilon = entropy_adaptive_epsilon(
            float(masked_mean(entropy.detach(), mask)),
            epsilon_base=p.clip_eps_base, alpha=p.entropy_clip_alpha, entropy_target=p.entropy_target,
        )  # fmt: skip
        c_low_start, c_high_start = 1.0 - epsilon, 1.0 + epsilon
        state["clip_eps"] = epsilon
    if p.bound_search:
        c_low, c_high, positive_share = bapo_search_clip_bounds(
            ratio, advantages, mask,
            c_low_start=c_low_start, c_low_max=p.c_low_max, c_high_start=c_high_start, c_high_max=p.c_high_max,
            c_low_step=p.c_low_step, c_high_step=p.c_high_step, target_positive_share=p.target_positive_share,
        )  # fmt: skip
        steps = bapo_search_steps(c_low, c_high, c_low_start=c_low_start, c_high_start=c_high_start,
                                  c_low_step=p.c_low_step, c_high_step=p.c_high_step)  # fmt: skip
    else:
        c_low, c_high, steps = c_low_start, c_high_start, 0
        positive_share = bapo_positive_share(ratio, advantages, mask, c_low=c_low, c_high=c_high)
    kept_positive, kept_negative = kept_contributions(ratio, advantages, mask, low_bound=c_low, high_bound=c_high)
    state.update(
        clip_bounds=(c_low, c_high),
        positive_share=positive_share,
        search_steps=steps,
        share_measured=kept_positive + kept_negative > 0,
    )
    return state


@register_objective(
    "bapo",
    description="PPO-clip with per-step adaptive bounds balancing positive/negative contributions.",
    paper=_BAPO_PAPER,
    default_aggregation="token_mean",
    default_advantage="group_norm",
    params=BAPOParams,
    prepare=bapo_prepare,
)
def bapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_normalizer: float,
    aggregation: str,
    entropy: Tensor | None = None,
    c_low_start: float = 0.6,
    c_low_max: float = 0.9,
    c_high_start: float = 1.2,
    c_high_max: float = 3.0,
    c_low_step: float = 0.05,
    c_high_step: float = 0.1,
    target_positive_share: float = 0.5,
    bound_search: bool = True,
    dual_clip: float | None = None,
    entropy_adaptive_clip: bool = False,
    clip_eps_base: float = 0.2,
    entropy_clip_alpha: float = 0.2,
    entropy_target: float = 1.5,
    positive_weight_sigmoid: bool = False,
    positive_weight_target: float = 0.45,
    positive_weight_beta: float = 5.0,
    positive_weight_sign: float = 1.0,
    clip_bounds: tuple[float, float] | None = None,
    positive_share: float | None = None,
    search_steps: int | None = None,
    clip_eps: float | None = None,
    share_measured: bool | None = None,
    **shared: Any,
) -> tuple[Tensor, dict[str, float]]:
    """BAPO: PPO-clip whose ratio bounds ``[c_low, c_high]`` are searched per mini-batch.

    Xi et al., "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy
    Optimization with Adaptive Clipping", arXiv 2510.18927. The bounds come from
    :func:`bapo_search_clip_bounds` on the (detached) ratios, then the loss is
    ``-min(r*A, clip(r, c_low, c_high)*A)`` (optionally dual-clipped, as the authors' recipe
    does with c=3).

    Batch-level state: ``clip_bounds``, ``positive_share``, ``search_steps``, ``share_measured`` and ``clip_eps`` are
    :func:`bapo_prepare`'s output for the whole mini-batch (the trainer passes them to every
    micro-batch). Called alone, without them, the function runs :func:`bapo_prepare` on its own
    inputs. They are not user params. ``bound_search=False`` uses the start bounds as they are.

    Options of polyrl's own (not in the paper):
    - ``entropy_adaptive_clip``: the search starts from ``1 -/+ eps_t`` with
      ``eps_t = clip_eps_base * (1 + entropy_clip_alpha * (entropy_target - H_t))``, ``H_t`` the
      masked mean of ``entropy`` over the mini-batch (see :func:`entropy_adaptive_epsilon` for
      the sign of ``entropy_clip_alpha``).
    - ``positive_weight_sigmoid``: A>0 token losses are weighted by
      ``lambda_pos = sigmoid(positive_weight_sign * beta * (C_actual - C_target))`` and A<0 ones
      by ``1 - lambda_pos``, with C_actual the mini-batch's positive share at the chosen bounds.
      With the default sign (+1) lambda_pos rises when positives already dominate, moving away
      from balance; use ``positive_weight_sign=-1`` to push towards C_target. At balance both
      weights are 0.5, halving the loss scale.
    """
    if clip_bounds is None:
        # Every BAPO param is a named argument here (the registry checks it): pass them all on.
        own_params = {name: value for name, value in locals().items() if name in BAPOParams.model_fields}
        state = bapo_prepare(logprobs, old_logprobs, advantages, mask, entropy=entropy, **own_params)
        clip_bounds, positive_share = state["clip_bounds"], state["positive_share"]
        search_steps, clip_eps = state["search_steps"], state.get("clip_eps")
        share_measured = state["share_measured"]
    x = ObjectiveInputs.zero_masked(logprobs, old_logprobs, advantages, mask, entropy=entropy,
                                    loss_normalizer=loss_normalizer, aggregation=aggregation, **shared)  # fmt: skip
    ratio, advantages, mask = token_ratio(x.logprobs, x.old_logprobs), x.advantages, x.mask
    c_low, c_high = clip_bounds
    if positive_share is None:
        positive_share = bapo_positive_share(ratio, advantages, mask, c_low=c_low, c_high=c_high)
    extra: dict[str, float] = {} if clip_eps is None else {"bapo/clip_eps": float(clip_eps)}

    per_token = clipped_surrogate_per_token(ratio, advantages, low_bound=c_low, high_bound=c_high, dual_clip=dual_clip)
    if positive_weight_sigmoid:
        weight = positive_weight(
            positive_share, target_share=positive_weight_target, beta=positive_weight_beta, sign=positive_weight_sign
        )
        token_weight = torch.where(
            advantages > 0,
            torch.full_like(per_token, weight),
            torch.where(advantages < 0, torch.full_like(per_token, 1.0 - weight), torch.ones_like(per_token)),
        )
        per_token = per_token * token_weight
        extra["bapo/positive_weight"] = weight

    loss, metrics = x.finalize(per_token, ratio=ratio, low_bound=c_low, high_bound=c_high)
    metrics.update(
        {
            "bapo/c_low": float(c_low),
            "bapo/c_high": float(c_high),
            "bapo/search_steps": float(search_steps or 0),
            **extra,
        }
    )
    # With no kept contribution in the whole mini-batch (every advantage 0: each group all right
    # or all wrong) the share is the search's stopping value 1.0, not a measured balance; logging
    # it would pull the share's mean over steps towards 1, so it is left out, as the common
    # positive_share is. (Decided per mini-batch: a micro-batch of it may hold no contribution.)
    if share_measured if share_measured is not None else "positive_share" in metrics:
        metrics["bapo/positive_share"] = float(positive_share)
    return loss, metrics
