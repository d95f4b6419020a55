"""The in-process vLLM engine's weights and KV cache, released for the learner's update.

In the synchronous loop nothing generates between a step's generation and the weight sync that
ends its update, and the sync replaces every weight: meanwhile the sampler's weights and its KV
cache are dead data that share the host with the update, the step's memory peak. On the CPU:

* vLLM keeps each Linear layer's weight only inside its oneDNN/SGL matmul handle
  (``layer.cpu_linear``, built by the layer's post-load processing; the parameter itself is
  emptied). Releasing drops the handles; the reload re-runs every loaded layer's processing and
  builds them anew, as every sync does anyway. A layer still without one after the reload is an
  error, never a silent stale weight.
* Every parameter that still holds memory (the input embedding, tied to the output head or not,
  an untied head, the norms) likewise: its storage is resized to nothing, and allocated again
  (zeroed) *before* the reload, which copies the new values into the same storage. A parameter
  the reload then misses would stay zero: vLLM names its layer ("Failed to load weights"),
  polyrl's sync filter (``vllm_quiet``) counts it in ``WEIGHT_SYNC_FAILURES``, and
  :func:`restore_after_reload` reads that count and raises, naming the layers: an engine that
  would sample with zeros never samples.
* The KV cache is one zero-initialised buffer viewed per layer. Releasing resizes its storage to
  nothing (the views keep the storage object, as FSDP frees parameter storage); the restore
  allocates it again and zeroes it, before the prefix cache is reset as after every sync, so no
  block of the old policy is read.

On SmolLM2-135M-Instruct in fp32 the handles held more live memory than the Linear weights
themselves (docs/benchmarks.md, "Where the memory went"), the KV cache its ``rollout.kv_cache_gb``. Off the CPU nothing is
released (the weights are the parameters, and the KV cache is on the GPU), nor for image-text
models (their vision tower's reload after a release was not tested). Exactness: the tests
compare the reloaded engine's log-probs with the learner's (< 1e-5 nats/token).
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from polyrl.engines.vllm_quiet import WEIGHT_SYNC_FAILURES

__all__ = [
    "RELEASED",
    "RELEASED_MESSAGE",
    "EngineReleasedError",
    "release_into_worker",
    "restore_after_reload",
    "restore_before_reload",
]

RELEASED_MESSAGE = (
    "the vLLM engine's weights were released for the learner's update (release_weights); sync the learner's "
    "weights before generating"
)


class EngineReleasedError(RuntimeError):
    """The engine was asked to sample between :meth:`release_weights` and the next sync."""


class _ReleasedLinear:
    """A Linear layer's ``cpu_linear`` between a release and the next reload."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise EngineReleasedError(RELEASED_MESSAGE)


RELEASED = _ReleasedLinear()


def _distinct_storages(tensors: Any) -> list[torch.UntypedStorage]:
    """The distinct CPU storages under ``tensors`` that hold memory (views and tied parameters
    share one; keyed by the storage's own address)."""
    storages: dict[int, torch.UntypedStorage] = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and not tensor.is_meta:
            storage = tensor.untyped_storage()
            if storage.nbytes():
                storages.setdefault(storage._cdata, storage)
    return list(storages.values())


def _release(runner: Any, attribute: str, tensors: Any) -> None:
    """Resize the storages under ``tensors`` to nothing; their sizes go to ``runner.<attribute>``."""
    released = getattr(runner, attribute, None) or []
    for storage in _distinct_storages(tensors):
        released.append((storage, storage.nbytes()))
        storage.resize_(0)
    setattr(runner, attribute, released)


def release_into_worker(worker: Any) -> int:
    """Runs inside the vLLM worker: drop every CPU matmul handle and the KV cache's memory;
    returns how many handles went."""
    runner = (getattr(worker, "worker", None) or worker).model_runner
    released = 0
    for module in runner.get_model().modules():
        if callable(getattr(module, "cpu_linear", None)) and module.cpu_linear is not RELEASED:
            module.cpu_linear = RELEASED
            released += 1
    if released:
        _release(runner, "_polyrl_released_kv", getattr(runner, "kv_caches", None) or [])
        _release(runner, "_polyrl_released_parameters", runner.get_model().parameters())
    gc.collect()
    return released


def _reallocate_zeroed(storage: torch.UntypedStorage, nbytes: int) -> None:
    storage.resize_(nbytes)
    torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,)).zero_()


def restore_before_reload(runner: Any) -> None:
    """Before a reload: the released parameters' memory back (zeroed), for the reload to copy into.
    Notes the sync filter's failure counts, so that :func:`restore_after_reload` sees this reload's."""
    released = getattr(runner, "_polyrl_released_parameters", None) or []
    for storage, nbytes in released:
        _reallocate_zeroed(storage, nbytes)
    runner._polyrl_released_parameters = []
    # None: nothing was released, a missed layer keeps its previous weights (a warning of the filter's).
    runner._polyrl_failures_before = dict(WEIGHT_SYNC_FAILURES) if released else None


def restore_after_reload(runner: Any, model: torch.nn.Module) -> None:
    """After a reload: the KV cache's memory back (zeroed), and every handle rebuilt or an error."""
    for storage, nbytes in getattr(runner, "_polyrl_released_kv", None) or []:
        _reallocate_zeroed(storage, nbytes)
    runner._polyrl_released_kv = []
    before = getattr(runner, "_polyrl_failures_before", None)
    runner._polyrl_failures_before = None
    if before is not None:
        zeroed = sorted(layer for layer, count in WEIGHT_SYNC_FAILURES.items() if count > before.get(layer, 0))
        if zeroed:
            raise RuntimeError(
                f"weight sync: vLLM loaded none of the tensors of {len(zeroed)} layer type(s) ({', '.join(zeroed)}) "
                "after their memory was released for the update, so they hold zeros; the engine would sample "
                "with them. The sync must send every parameter of the policy"
            )
    missed = [name for name, module in model.named_modules() if getattr(module, "cpu_linear", None) is RELEASED]
    if missed:
        raise RuntimeError(
            f"weight sync: {len(missed)} layers released before the update were not reloaded "
            f"(e.g. {missed[:3]}); the engine would sample without them"
        )
