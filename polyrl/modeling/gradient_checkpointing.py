"""``train.gradient_checkpointing``: each decoder layer's activations are recomputed in the
backward instead of kept (``torch.utils.checkpoint``, non-reentrant).

transformers' own switch (``gradient_checkpointing_enable``) checkpoints a layer only while the
model is in training mode (``GradientCheckpointingLayer.__call__`` tests ``self.training``), but
polyrl's learner keeps its models in eval mode so that dropout is off in every pass: there the
switch would silently do nothing. So each of the model's ``GradientCheckpointingLayer`` modules
(transformers' decoder and vision layers) gets its bound ``forward`` wrapped on the instance,
whatever the mode, while grad is enabled; no-grad passes (π_old, reference, values) run as before.
Non-reentrant checkpointing needs no input that requires grad, so a frozen embedding under LoRA
needs no ``enable_input_require_grads``. Parameter names and the state dict are unchanged.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint

from polyrl.core.errors import PolyrlError

__all__ = ["GradientCheckpointingError", "checkpoint_layers"]


class GradientCheckpointingError(PolyrlError):
    """``train.gradient_checkpointing`` cannot apply to this model."""


def _checkpointed(forward, keeps_cache: bool):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if not keeps_cache:
            # As transformers' own checkpointing: a KV cache written in the forward would be written
            # again by the recompute (keys twice as long as the mask). A training forward reads none.
            for key in ("past_key_values", "layer_past"):
                if kwargs.get(key) is not None:
                    kwargs[key] = None
            if kwargs.get("use_cache"):
                kwargs["use_cache"] = False
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    run.polyrl_checkpointed = True
    return run


def checkpoint_layers(model: torch.nn.Module, *, role: str = "policy") -> int:
    """Wrap the forward of every transformers layer of ``model`` that supports checkpointing;
    returns how many. Raises :class:`GradientCheckpointingError` when there is none."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise GradientCheckpointingError(
            f"train.gradient_checkpointing: the {role} ({type(model).__name__}) has no transformers "
            "layers that support checkpointing; set it to false"
        )
    for layer in layers:
        if not getattr(layer.forward, "polyrl_checkpointed", False):
            layer.forward = _checkpointed(layer.forward, getattr(layer, "_can_checkpoint_with_cache", False))
    return len(layers)
