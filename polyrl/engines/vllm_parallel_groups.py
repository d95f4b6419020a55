"""vLLM's parallel groups, one set per process and shared by every in-process vLLM engine.

A policy's rollout engine may live beside a judge's (:mod:`polyrl.reward_models.judge_engines`),
and vLLM's parallel groups are one per process, used by all of them: tearing them down while
another engine lives leaves that one failing its next step ("pipeline model parallel group is
not initialized"). :data:`LIVE_ENGINES` tracks the engines not yet closed; a closing engine keeps
the groups up while others live (:func:`parallel_groups_kept`), and the last one destroys them
(:func:`destroy_parallel_groups`).
"""

from __future__ import annotations

import gc
import weakref
from contextlib import contextmanager
from typing import Iterator

__all__ = ["LIVE_ENGINES", "destroy_parallel_groups", "parallel_groups_kept"]

# The vLLM engines of this process not yet closed (weak: a dropped engine does not count).
LIVE_ENGINES: "weakref.WeakSet[object]" = weakref.WeakSet()


@contextmanager
def parallel_groups_kept(keep: bool) -> Iterator[None]:
    """Inside, vLLM's in-process ``EngineCore.shutdown`` frees its engine's memory but, when
    ``keep``, leaves the process's parallel groups up (it calls ``cleanup_dist_env_and_memory``,
    which destroys them, whoever else uses them)."""
    import vllm.v1.engine.core as engine_core_module

    teardown = getattr(engine_core_module, "cleanup_dist_env_and_memory", None)
    if not keep or teardown is None:
        yield
        return
    engine_core_module.cleanup_dist_env_and_memory = lambda *args, **kwargs: gc.collect()
    try:
        yield
    finally:
        engine_core_module.cleanup_dist_env_and_memory = teardown


def destroy_parallel_groups() -> None:
    """Destroy the process's model-parallel groups and distributed environment (once the last
    engine has closed); best effort."""
    try:
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
    except Exception:  # noqa: BLE001 - best effort teardown
        pass
