"""Mixed precision: fp32 master weights and optimizer state, forward/backward in the compute dtype.

``model.dtype: bfloat16`` names the *compute* dtype. Weights stay fp32 and AdamW keeps fp32
moments, so an update smaller than bf16's rounding step (lr 1e-6 on a weight of 0.5, say)
still lands; the forward and backward passes run under ``torch.autocast`` in bf16. This is
torchtitan's mixed-precision setting (``mixed_precision_param = bfloat16``,
``mixed_precision_reduce = float32``) and what verl's FSDP workers do; pure-bf16 weights would
drop most of such updates.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

COMPUTE_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def compute_dtype(name: str) -> torch.dtype:
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"unknown compute dtype {name!r}; allowed: {', '.join(COMPUTE_DTYPES)}")
    return COMPUTE_DTYPES[name]


def autocast(model: torch.nn.Module, dtype: torch.dtype) -> ContextManager:
    """Autocast on ``model``'s device in ``dtype``; a no-op for fp32 (and fp64 test models)."""
    if dtype in (torch.float32, torch.float64):
        return contextlib.nullcontext()
    device = next(model.parameters()).device
    return torch.autocast(device_type=device.type, dtype=dtype)
