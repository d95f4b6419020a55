"""The guard that keeps non-finite updates away from the weights: an optimizer step whose loss or
gradient norm is NaN/inf is skipped (gradients zeroed, the skip counted), and too many in a row
stop training with :class:`NonFiniteTrainingError`. The policy learner and the critic both step
through :func:`guarded_step`; the health monitor (:mod:`polyrl.monitoring.health`) reports the skips.
"""

from __future__ import annotations

import math
from typing import Any

from polyrl.core.errors import PolyrlError
from polyrl.learner.lr_schedule import set_learning_rate


class NonFiniteTrainingError(PolyrlError):
    """Training stopped because too many optimizer steps in a row had a NaN/inf loss or gradient norm."""


# What a skipped step's reason reads as in warnings and errors.
NONFINITE_REASONS: dict[str, str] = {
    "loss": "policy loss",
    "grad_norm": "policy gradient norm",
    "critic_loss": "critic loss",
    "critic_grad_norm": "critic gradient norm",
}


class NonFiniteGuard:
    """Decides whether an optimizer step may be applied and counts consecutive refusals.

    A step whose loss or gradient norm is NaN/inf is skipped (its gradients are zeroed, the
    weights and optimizer state stay the last good ones); :attr:`exhausted` turns true after
    ``max_consecutive`` skips in a row. The same policy as mixed-precision loss scalers
    (torch.amp's GradScaler, Megatron's skipped iterations), which skip rather than apply.
    """

    def __init__(self, max_consecutive: int, *, prefix: str = ""):
        self.max_consecutive = max_consecutive
        self.prefix = prefix
        self.consecutive = 0

    def check(self, loss: float, grad_norm: float) -> str | None:
        """``None`` when the step may be applied, else the reason: ``"loss"`` or ``"grad_norm"`` (prefixed)."""
        reason = None
        if not math.isfinite(loss):
            reason = "loss"
        elif not math.isfinite(grad_norm):
            reason = "grad_norm"
        self.consecutive = 0 if reason is None else self.consecutive + 1
        return None if reason is None else self.prefix + reason

    @property
    def exhausted(self) -> bool:
        return self.consecutive >= self.max_consecutive

    def state_dict(self) -> dict[str, Any]:
        return {"consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consecutive = int(state.get("consecutive", 0))


class NonFiniteStop(Exception):
    """Raised by a role when its guard is exhausted; the loop saves the last good weights and
    turns it into a :class:`NonFiniteTrainingError` that says where they are.

    ``applied_steps``: the policy optimizer steps of the stopped update that were applied before
    the stop (its remaining ones are skipped); 0 leaves the learner as after the previous step."""

    def __init__(self, reason: str, consecutive: int, applied_steps: int = 0):
        super().__init__(f"{consecutive} non-finite {NONFINITE_REASONS[reason]} steps in a row")
        self.reason = reason
        self.consecutive = consecutive
        self.applied_steps = applied_steps


def guarded_step(
    optimizer: Any,
    guard: NonFiniteGuard,
    loss: float,
    grad_norm: float,
    skipped: dict[str, int],
    learning_rate: float | None = None,
) -> bool:
    """Apply ``optimizer``'s step unless the loss or gradient norm is NaN/inf; else zero the
    gradients, count the skip in ``skipped`` and raise :class:`NonFiniteStop` after too many in a row."""
    reason = guard.check(loss, grad_norm)
    if reason is None:
        if learning_rate is not None:
            set_learning_rate(optimizer, learning_rate)
        optimizer.step()
        return True
    optimizer.zero_grad(set_to_none=True)
    skipped[reason] = skipped.get(reason, 0) + 1
    if guard.exhausted:
        raise NonFiniteStop(reason, guard.consecutive)
    return False
