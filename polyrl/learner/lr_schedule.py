"""Learning-rate schedules, a pure function of the config and the optimizer-step counter.

No scheduler object holds state: the learning rate of optimizer step ``s`` is computed from the
config and ``s`` right before that step, and ``s`` (the learner's optimizer-step counter) is
checkpointed. A resumed run therefore follows the schedule its config describes.

Shapes, for ``s = 1..S`` (1-based optimizer steps), base rate ``lr``, ``W`` warm-up steps and
``m = min_lr_ratio``:

- warm-up, ``s <= W``: ``lr * s / (W + 1)`` (torchtitan's ramp: the first step is never taken
  at rate 0, as it is with transformers' ``get_*_schedule_with_warmup``);
- then, with ``p = (s - W - 1) / (S - W)`` (transformers' decay progress: 0 at the first step
  after warm-up):
  ``constant``: ``lr``; ``linear``: ``lr * (1 - (1 - m) * p)``;
  ``cosine``: ``lr * (m + (1 - m) * (1 + cos(pi * p)) / 2)``.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

LR_SCHEDULES: tuple[str, ...] = ("constant", "linear", "cosine")


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0) -> float:
    """Multiplier of the base learning rate for optimizer step ``step`` (1-based)."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown lr_schedule {schedule!r}; allowed: {', '.join(LR_SCHEDULES)}")
    if step <= warmup_steps:
        return step / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    progress = min(max(step - warmup_steps - 1, 0) / max(total_steps - warmup_steps, 1), 1.0)
    if schedule == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * progress
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def apply_optimizer_settings(optimizer: torch.optim.Optimizer, *, lr: float, betas: Iterable[float] | None = None,
                             weight_decay: float | None = None) -> None:  # fmt: skip
    """Write the config's hyper-parameters into every param group.

    A checkpoint restores the optimizer's param groups as they were saved; the config is the
    truth, so after a resume these are reset from it (a changed learning rate then applies).
    Keys the optimizer does not have (``betas`` of SGD) are left alone.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
        if betas is not None and "betas" in group:
            group["betas"] = tuple(float(b) for b in betas)
        if weight_decay is not None and "weight_decay" in group:
            group["weight_decay"] = float(weight_decay)
