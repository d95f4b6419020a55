"""Weight sync inside vLLM's worker: new weights reloaded in place, and what a reload cannot reach.

Runs in the worker (in-process: a direct call through ``collective_rpc``). vLLM's in-place reload
re-processes only the layers whose weights it loads by name, so two kinds of layer need care: the
tied output heads (skipped by the reload, their processed form rebuilt here) and the layers whose
only tensors are buffers computed from the config (nothing to load; their miss is expected). The
released-memory side of the same worker lives in :mod:`polyrl.engines.vllm_release`.
"""

from __future__ import annotations

from typing import Any

import torch

from polyrl.engines.vllm_release import restore_after_reload, restore_before_reload


def is_output_head(name: str) -> bool:
    """The output head's weight name (``lm_head.weight``, or a VLM's ``language_model.lm_head.weight``)."""
    return name == "lm_head.weight" or name.endswith(".lm_head.weight")


def reload_into_worker(worker: Any, weights: list[tuple[str, torch.Tensor]], refresh_output_head: bool) -> int:
    """Runs inside the vLLM worker (in-process: a direct call). Returns the number of tensors."""
    from polyrl.engines.vllm_quiet import expected_misses, install_weight_sync_filter

    install_weight_sync_filter()  # in the worker's process: drops the rotary-cache warning, escalates real misses
    inner = getattr(worker, "worker", None) or worker
    runner = inner.model_runner
    model = runner.get_model()
    restore_before_reload(runner)  # released parameters' memory back first: the reload copies into it
    # One walk finds the tied heads: they are both expected to miss and refreshed after the reload.
    tied_heads = _tied_heads(model) if refresh_output_head else []
    with expected_misses(_computed_buffer_layers(model) | {type(head).__name__ for head in tied_heads}):
        runner.reload_weights(weights_iterator=iter(weights))
    _refresh_heads(tied_heads)
    restore_after_reload(runner, model)
    return len(weights)


def _computed_buffer_layers(model: torch.nn.Module) -> set[str]:
    """Class names of the layers a reload cannot reach by name and need not: those whose only own
    tensors are non-persistent buffers computed from the config (Gemma 3's ``normalizer``). (The
    tied output heads are the other such layers; :func:`_refresh_heads` rebuilds them.)"""
    names = set()
    for module in model.modules():
        own_buffers = [name for name, _ in module.named_buffers(recurse=False)]
        if own_buffers and not list(module.parameters(recurse=False)) and set(own_buffers) <= module._non_persistent_buffers_set:
            names.add(type(module).__name__)
    return names


def _tied_heads(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The output heads (``ParallelLMHead``) that share their weight with an input embedding."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    embeddings = [m for m in model.modules() if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)]
    heads = []
    for head in model.modules():
        weight = getattr(head, "weight", None) if isinstance(head, ParallelLMHead) else None
        if weight is None or weight.is_meta or weight.numel() == 0:
            continue
        if any(e.weight is weight or e.weight.data_ptr() == weight.data_ptr() for e in embeddings):
            heads.append(head)
    return heads


def _refresh_vocab_layers(model: torch.nn.Module) -> int:
    """Re-run post-load processing of every *tied* output head; returns how many were refreshed.

    vLLM's in-place reload re-processes only the layers whose weights it loaded. A tied
    ``lm_head`` shares ``embed_tokens.weight`` and is skipped by ``load_weights``, so its
    processed form is never rebuilt. On CPU that form is ``layer.cpu_linear``, built once at
    start-up: with AMX and bf16/fp16 weights it multiplies with a *packed copy* of the weight
    (sgl ``weight_packed_linear``), which stays at the start-up values however the shared
    parameter changes; with oneDNN/torch fallbacks it reads the shared storage and happens to
    see the new values. Re-processing rebuilds it from the current shared weight in every
    case. A no-op off CPU (CUDA heads read ``layer.weight`` directly).
    """
    return _refresh_heads(_tied_heads(model))


def _refresh_heads(heads: list[torch.nn.Module]) -> int:
    """Re-run the post-load processing of ``heads`` (tied output heads); returns how many."""
    refreshed = 0
    with torch.no_grad():
        for head in heads:
            method = getattr(head, "quant_method", None)
            if method is not None:
                method.process_weights_after_loading(head)
                refreshed += 1
    return refreshed
