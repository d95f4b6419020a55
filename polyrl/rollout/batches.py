"""The data a training step passes between its phases: the rollout, its scores, the learner batch.

Plain data (tensors and lists), so a phase can run in-process or behind a Ray actor unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from polyrl.core.types import Completion, PromptSample
from polyrl.modeling.batches import PackedBatch


@dataclass
class Rollout:
    """G completions for each of P prompts, flattened prompt-major."""

    prompts: list[PromptSample]  # one per completion (each prompt repeated G times)
    completions: list[Completion]
    group_ids: Tensor  # [N]

    def __len__(self) -> int:
        return len(self.completions)

    def select(self, keep: list[int]) -> "Rollout":
        return Rollout(
            [self.prompts[i] for i in keep],
            [self.completions[i] for i in keep],
            self.group_ids[torch.as_tensor(keep, dtype=torch.long)],
        )

    @staticmethod
    def concat(parts: list["Rollout"]) -> "Rollout":
        if not parts:
            return Rollout([], [], torch.zeros(0, dtype=torch.long))
        return Rollout(
            [p for part in parts for p in part.prompts],
            [c for part in parts for c in part.completions],
            torch.cat([part.group_ids for part in parts]),
        )


@dataclass
class Scores:
    totals: list[float | None]
    metrics: dict[str, float]
    per_module: dict[str, list[float | None]] = field(default_factory=dict)
    # One reward baseline per sample (ReMax: the reward of its prompt's greedy completion); None: none.
    baselines: list[float | None] | None = None

    def select(self, keep: list[int]) -> "Scores":
        return Scores(
            [self.totals[i] for i in keep],
            self.metrics,
            {k: [v[i] for i in keep] for k, v in self.per_module.items()},
            None if self.baselines is None else [self.baselines[i] for i in keep],
        )


@dataclass
class LearnerBatch:
    packed: PackedBatch
    old_logprobs: Tensor | None  # None: taken from the update's own first forward pass
    advantages: Tensor
    ref_logprobs: Tensor | None = None
    old_values: Tensor | None = None
    returns: Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    # The tokens that train: the response mask without the rows that must not (unscored
    # samples; truncated ones under overlong.mode mask_truncated). It is the mask of the loss,
    # its normaliser, the KL and entropy terms, the metrics and the critic loss.
    loss_mask: Tensor | None = None
    # Each row's policy version (Completion.policy_version; -1 where none, as in the synchronous
    # loop): the learner compares its first forward with the sampler on the rows sampled at its
    # own weights only (the mismatch diagnostics, polyrl/algos/rollout_correction.py).
    policy_versions: Tensor | None = None
    # Rollout correction in bypass mode (CorrectionSettings): its masks compare the current π_θ with
    # the sampler, so the learner applies them in each micro-batch; None: nothing left to apply.
    in_update_correction: Any = None
    # The tokens a decoupled rollout correction took out of the loss mask (the rollout inspector's
    # "masked"); None without one.
    correction_rejected: Tensor | None = None

    def __post_init__(self) -> None:
        if self.loss_mask is None:
            self.loss_mask = self.packed.response_mask.bool()

    def to(self, device: torch.device | str) -> "LearnerBatch":
        """The same batch with every tensor on ``device`` (the learner's; the pipeline builds it on the CPU)."""
        tensors = {f.name: value.to(device) for f in fields(self) if isinstance(value := getattr(self, f.name), Tensor)}
        return replace(self, packed=self.packed.to(device), **tensors)


def length_metrics(completions: Sequence[Any], prefix: str) -> dict[str, float]:
    """``<prefix>/response_length/{mean,min,max,clipped_ratio}`` and ``<prefix>/samples`` of ``completions``."""
    if not len(completions):
        return {f"{prefix}/samples": 0.0}
    # The policy's tokens only: an episode's observation tokens are no response length.
    lengths = np.array([c.policy_length for c in completions], dtype=np.float64)
    return {
        f"{prefix}/response_length/mean": float(lengths.mean()),
        f"{prefix}/response_length/min": float(lengths.min()),
        f"{prefix}/response_length/max": float(lengths.max()),
        f"{prefix}/response_length/clipped_ratio": float(np.mean([c.truncated for c in completions])),
        f"{prefix}/samples": float(len(completions)),
    }
