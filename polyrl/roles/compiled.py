"""Opt-in ``torch.compile`` of the policy's decoder (``train.compile``).

The learner's forward is the policy's decoder followed by the output head at the response
positions only (``polyrl.algos.logprobs``); the decoder holds nearly all of the FLOPs and all
of the element-wise work (norms, SiLU, rotary embeddings) that eager mode runs as separate
kernels. Compiling it fuses those. Measured on the 2-core machine, 30m policy, fp32, micro-batches
of 16 × 96–120 tokens, forward + backward + fused AdamW: 1,025 tokens/s compiled vs ~930 eager
(×1.10), after a one-off compile of ~60 s (``bench/bench_compile.py``). So it pays on runs
longer than a few hundred update seconds and is off by default, as in TRL (``torch_compile``)
and torchtitan (``compile.enable``), where it is opt-in too.

Those figures are against eager mode on torch's BLAS. Where ``train.cpu_matmul`` puts the
learner's Linear layers on oneDNN (``auto`` on a CPU that is not Intel's, :mod:`polyrl.roles.cpu_matmul`),
they run as custom ops that Inductor keeps whole when the decoder is compiled: then the GEMMs are
oneDNN's and compilation fuses the element-wise work between them; elsewhere Inductor calls
torch's BLAS. On an AMD Zen 5 with oneDNN linears on both sides, 30m, compiled vs eager: ×1.20
on fixed 16 × 70-token micro-batches, ×1.02 in ``bench_compile.py`` (lengths 96–120), and no
gain in the RL step (``bench_step.py --compile``: 222.6 vs 230.5 GFLOP/s, within noise), after a
one-off 50–90 s. On an Intel Xeon with MKL's GEMMs: ×1.20 in ``bench_compile.py`` after a 95 s
compile, and no consistent gain in the RL step. So it stays opt-in.

``dynamic=True`` because every batch has another sequence length; without it each new length
recompiles. The decoder's bound ``forward`` is replaced on the instance, so parameter names, the
state dict (checkpoints), weight sync and the optimizer see the same module as in eager mode.
"""

from __future__ import annotations

import shutil

import torch

from polyrl.core.errors import PolyrlError

__all__ = ["CompileError", "compile_decoder"]


class CompileError(PolyrlError):
    """``train.compile`` cannot apply to this policy or machine."""


def compile_decoder(policy: torch.nn.Module, *, takes_images: bool) -> torch.nn.Module:
    """Compile ``policy``'s decoder forward in place; returns the decoder."""
    if takes_images:
        # Image batches run the multimodal base model (vision tower included), not the decoder
        # alone: compiling the decoder would leave the image path eager while claiming otherwise.
        raise CompileError("train.compile: supported for text policies only; this policy is an image-text model")
    decoder = policy.get_decoder() if hasattr(policy, "get_decoder") else None
    if decoder is None or decoder is policy:
        raise CompileError(f"train.compile: {type(policy).__name__} has no separate decoder to compile")
    if torch.device(next(policy.parameters()).device).type == "cpu" and shutil.which("g++") is None and shutil.which("c++") is None:
        raise CompileError("train.compile: torch.compile on CPU needs a C++ compiler (g++) on PATH; install one or leave train.compile off")
    decoder.forward = torch.compile(decoder.forward, dynamic=True)
    return decoder
