"""Entropy controls: an entropy coefficient adapted toward a target entropy, and the gradient
restricted to the batch's highest-entropy tokens.

- Adaptive coefficient: after each training step, ``α ← clip(α + η·(H_target − H), 0, α_max)``
  where ``H`` is the step's mean token entropy: the bonus grows while the policy is less random
  than the target and shrinks back (to 0, never negative) once it is above. This is the automatic
  temperature of Soft Actor-Critic ("Soft Actor-Critic Algorithms and Applications", Haarnoja
  et al., arXiv 1812.05905, §5) applied to the entropy bonus, as the adaptive entropy control of
  "Skywork Open Reasoner 1 Technical Report" (Skywork-OR1, arXiv 2505.22312; its adaptive entropy
  control) does for LLM RL. Deviation from Skywork-OR1: a proportional
  step ``η·(H_target − H)`` instead of a fixed ±Δ step, and no "only when below target" switch
  (the clip at 0 plays that role).
- High-entropy tokens ("Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
  Reinforcement Learning for LLM Reasoning", Wang et al., arXiv 2506.01939; its RLVR with the
  top-20% high-entropy tokens): only the top-ρ
  share of response tokens by entropy (ρ = 0.2 in the paper) keep their policy gradient. Deviation:
  the threshold is taken over each micro-batch the learner computes, not over the whole batch
  (equal when a micro-batch holds the mini-batch); the loss normaliser still counts every token.
  ``actor/entropy`` (the adaptive coefficient's ``H``, and the entropy-collapse check's) stays the
  mean over every token that trains before the selection; ``actor/entropy_selected`` is the mean
  over the tokens kept (:func:`selection_entropy_parts`). Read off the selected tokens alone, the
  mean is that of the top ρ by construction (well above the policy's), so a controller steering
  on it would never turn its bonus on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from polyrl.algos.metric_parts import ratio_parts

__all__ = [
    "AdaptiveEntropySettings",
    "EntropyController",
    "adaptive_entropy_coef",
    "high_entropy_token_mask",
    "selection_entropy_parts",
]


def adaptive_entropy_coef(
    coef: float, entropy: float, *, target: float, step_size: float, max_coef: float
) -> tuple[float, dict[str, float]]:
    """The next coefficient ``clip(coef + step_size·(target − entropy), 0, max_coef)``."""
    new = min(max(coef + step_size * (target - entropy), 0.0), max_coef)
    return new, {"actor/entropy_coef": new, "actor/entropy_target_gap": target - entropy}


def high_entropy_token_mask(entropy: Tensor, mask: Tensor, *, top_ratio: float) -> tuple[Tensor, dict[str, float]]:
    """Keep the ``ceil(top_ratio · n)`` highest-entropy of the ``n`` tokens in ``mask`` (ties at the
    threshold kept too); returns the new mask and the share kept and the threshold (the learner logs
    them as actor/high_entropy_kept_fraction and actor/high_entropy_threshold)."""
    mask = mask.bool()
    values = entropy.detach()[mask]
    if values.numel() == 0:
        return mask.clone(), {"high_entropy_kept_fraction": 0.0}
    k = max(1, int(torch.ceil(torch.tensor(top_ratio * values.numel())).item()))
    threshold = torch.topk(values.float(), k).values.min()
    keep = mask & (entropy.detach() >= threshold)
    return keep, {
        "high_entropy_kept_fraction": float(keep.sum()) / float(mask.sum()),
        "high_entropy_threshold": float(threshold),
    }


def selection_entropy_parts(entropy: Tensor, trained: Tensor, selected: Tensor) -> dict[str, float]:
    """The sums behind ``entropy`` (the mean over ``trained``, the tokens that train before the
    high-entropy selection) and ``entropy_selected`` (over ``selected``, those it keeps), as
    :func:`~polyrl.algos.metric_parts.ratio_parts`, so that micro-batches and ranks combine them
    into exact means over all their tokens."""
    values = entropy.detach().float()
    trained, selected = trained.bool(), selected.bool()
    return {
        **ratio_parts("entropy", float(values[trained].sum()), float(trained.sum())),
        **ratio_parts("entropy_selected", float(values[selected].sum()), float(selected.sum())),
    }


@dataclass(frozen=True)
class AdaptiveEntropySettings:
    target: float
    step_size: float
    max_coef: float


class EntropyController:
    """The learner's entropy coefficient: fixed (``settings`` None) or adapted after each step."""

    def __init__(self, coef: float, settings: AdaptiveEntropySettings | None = None):
        self.coef = coef
        self.settings = settings

    @property
    def active(self) -> bool:
        """Whether the entropy takes part in the gradient (a bonus now, or one that may come)."""
        return self.coef != 0 or self.settings is not None

    def observe(self, entropy: float | None) -> dict[str, float]:
        """After a step with mean token entropy ``entropy``: the next coefficient, and its metrics."""
        if self.settings is None or entropy is None:
            return {}
        s = self.settings
        self.coef, metrics = adaptive_entropy_coef(
            self.coef, entropy, target=s.target, step_size=s.step_size, max_coef=s.max_coef
        )
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "coef" in state:
            self.coef = float(state["coef"])
