"""Gradient memory allocated once per update, before its first forward, and reused by every
mini-batch.

Left to autograd, a parameter's gradient is allocated by the first backward that reaches it:
in the middle of that backward, among the activations it is freeing. On the CPU those blocks
then sit between the holes the activations leave, and the next micro-batch's activations no
longer fit the holes: glibc grows the heap and keeps the holes resident. A trace on
SmolLM2-135M (``bench/compare_trl.py --trace-rss``) showed the update's second micro-batch
growing the resident set by more than the gradients it added, and glibc holding far more freed
memory during the update than TRL did (docs/benchmarks.md, "Where the memory went").

Here every trainable parameter's gradient is allocated when the update begins, before
any activation, and zeroed in place for each mini-batch: backward adds into it (autograd
accumulates in place into an existing gradient). A parameter no backward of the mini-batch
reached gets ``grad = None`` back before the optimizer step, as without the buffers: AdamW skips
it (no state, no weight decay) and the data-parallel reduction sees it as not reached. Hooks
(``register_post_accumulate_grad_hook``) record which parameters were reached; they exist only
during the update.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor

__all__ = ["AutogradGradients", "GradientBuffers", "update_gradients"]


class GradientBuffers:
    """One update's gradient memory for ``parameters`` (those with ``requires_grad``)."""

    def __init__(self, parameters: Iterable[Tensor]) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        self.buffers = [torch.empty_like(p) for p in self.parameters]  # zeroed by start_mini_batch, before any backward
        self.reached: set[int] = set()
        self.hooks = [p.register_post_accumulate_grad_hook(self._mark) for p in self.parameters]

    def _mark(self, parameter: Tensor) -> None:
        self.reached.add(id(parameter))

    def start_mini_batch(self) -> None:
        """Every gradient zero, in the buffers allocated at the update's start."""
        for parameter, buffer in zip(self.parameters, self.buffers):
            buffer.zero_()
            parameter.grad = buffer
        self.reached.clear()

    def drop_unreached(self) -> None:
        """``grad = None`` for the parameters no backward of this mini-batch reached."""
        for parameter in self.parameters:
            if id(parameter) not in self.reached:
                parameter.grad = None

    def close(self) -> None:
        """Hooks removed, gradients and buffers freed."""
        for hook in self.hooks:
            hook.remove()
        for parameter in self.parameters:
            parameter.grad = None
        self.hooks, self.buffers, self.parameters = [], [], []


class AutogradGradients:
    """The same interface with autograd's own allocation (``grad = None`` between mini-batches),
    where the buffers cannot apply: FSDP2's sharded parameters receive their gradients from its
    reduce-scatter, not through the hooks that mark a parameter reached."""

    def __init__(self, parameters: Iterable[Tensor]) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]

    def start_mini_batch(self) -> None:
        for parameter in self.parameters:
            parameter.grad = None

    def drop_unreached(self) -> None:
        return None

    def close(self) -> None:
        self.start_mini_batch()


def update_gradients(parameters: Iterable[Tensor], *, sharded: bool) -> GradientBuffers | AutogradGradients:
    """Gradient buffers, or autograd's allocation for FSDP2-sharded parameters (``sharded``)."""
    return AutogradGradients(parameters) if sharded else GradientBuffers(parameters)
