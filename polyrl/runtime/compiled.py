"""Opt-in ``torch.compile`` of the policy's decoder layers (``train.compile``).

The learner's forward is the policy's decoder followed by the output head at the response
positions only (``polyrl.modeling.logprobs``); the decoder layers hold nearly all of the FLOPs and
all of the element-wise work (norms, SiLU, rotary embeddings, residual adds) that eager mode runs
as separate kernels, each reading and writing activations from memory. Compiling fuses that
work between the matmuls.

Each decoder layer is compiled on its own (as torchtitan does per transformer block), not the
decoder as one graph: every layer runs the same code, so Dynamo traces it once and all layers
share the graph (its parameters are graph inputs), and compile time no longer grows with depth.
Per layer, the update gains nearly what one whole-decoder graph gains, for a fraction of its
one-off compile time (the measured figures: docs/benchmarks.md).

Dynamo's guards give at most a couple of graphs per run (``dynamic=True``; one recompile when
rows × columns crosses an Inductor code-generation threshold), far below its recompile limit of
8, beyond which it would silently run a layer eager. The learner calls the decoder with
``use_cache=False``; a KV cache would guard on each layer's index and recompile per layer.

Where ``train.cpu_matmul`` puts the learner's Linear layers on oneDNN (``auto`` on a CPU that is
not Intel's, :mod:`polyrl.runtime.cpu_matmul`), they run as custom ops that Inductor keeps whole:
then the GEMMs are oneDNN's and compilation fuses the element-wise work between them.

Off by default, as in TRL (``torch_compile``) and torchtitan (``compile.enable``): the one-off
compile costs more than it saves on short runs such as the demo's. Each layer's
bound ``forward`` is replaced on the instance, so parameter names, the state dict
(checkpoints), weight sync and the optimizer see the same modules as in eager mode.
"""

from __future__ import annotations

import shutil

import torch

from polyrl.core.errors import PolyrlError
from polyrl.runtime.devices import has_cuda

__all__ = ["CompileError", "compile_decoder_layers"]


class CompileError(PolyrlError):
    """``train.compile`` cannot apply to this policy or machine."""


def has_cpp_compiler() -> bool:
    """Inductor's CPU code generation needs a C++ compiler on PATH."""
    return shutil.which("g++") is not None or shutil.which("c++") is not None


def compile_decoder_layers(policy: torch.nn.Module, *, takes_images: bool) -> list[torch.nn.Module]:
    """Compile the forward of each of ``policy``'s decoder layers in place; returns the layers."""
    if takes_images:
        # Image batches run the multimodal base model (vision tower included), not the decoder
        # alone: compiling the decoder would leave the image path eager while claiming otherwise.
        raise CompileError("train.compile: supported for text policies only; this policy is an image-text model")
    decoder = policy.get_decoder() if hasattr(policy, "get_decoder") else None
    if decoder is None or decoder is policy:
        raise CompileError(f"train.compile: {type(policy).__name__} has no separate decoder to compile")
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise CompileError(f"train.compile: {type(decoder).__name__} has no `layers` list of decoder layers to compile")
    if torch.device(next(policy.parameters()).device).type == "cpu" and not has_cpp_compiler():
        raise CompileError(
            "train.compile: torch.compile on CPU needs a C++ compiler (g++) on PATH; install one or leave train.compile off"
        )
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)
    return list(layers)


def check_sampler_compile(*, takes_images: bool) -> None:
    """Refuse ``rollout.compile`` where it is untested or cannot build.

    The weight sync into vLLM's compiled text model is checked against the learner
    (tests/engines/test_rollout_contract.py); for image-text models vLLM also compiles the
    vision tower, whose syncs and encoder-cache resets were never checked compiled here.
    """
    if takes_images:
        raise CompileError("rollout.compile: supported for text policies only; this policy is an image-text model")
    if not has_cuda() and not has_cpp_compiler():
        raise CompileError(
            "rollout.compile: vLLM's compiled sampler on CPU needs a C++ compiler (g++) on PATH; install one or leave rollout.compile off"
        )
