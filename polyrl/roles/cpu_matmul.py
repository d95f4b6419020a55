"""The learner's fp32 Linear layers on CPU through oneDNN instead of torch's default BLAS (``train.cpu_matmul``).

Why: torch's CPU build runs an fp32 ``nn.Linear`` as an MKL ``sgemm``. MKL picks its kernels by
CPU vendor, and on this machine's AMD EPYC (Zen 5, AVX-512 with full-width FMA units) it runs
at ~200 GFLOP/s on two threads, where oneDNN (which dispatches on the instruction set, not the
vendor) runs the same fp32 products at ~420–470 GFLOP/s. vLLM's CPU backend already sends its
Linear layers to oneDNN (``dispatch_cpu_unquantized_gemm``), so the rollout side had this and
the learner did not. Matmuls are ~87% of the 30m policy's update (torch profiler), so the GEMM
library bounds the update.

What changes: each ``nn.Linear`` of the routed module computes ``x Wᵀ + b`` and both gradients
(``∂x = g W``, ``∂W = gᵀ x``, ``∂b = Σ g``) with oneDNN's fp32 inner-product
(``torch.ops.mkldnn._linear_pointwise``, the op torch's own Inductor emits for CPU linears).
Same maths in fp32 (IEEE, no reduced-precision mode); only the summation order differs, so
results match torch's to fp32 rounding (tests: values and all three gradients to 1e-5
relative). Parameters, state dict, optimizer and weight sync are untouched: only the
instances' ``forward`` is replaced.

When: ``auto`` (the default) routes when oneDNN is in this torch build, the learner computes
in fp32 and ``train.compile`` is off (a compiled decoder runs Inductor's own kernels; bf16
autocast already sends matmuls to oneDNN). The choice is a rule, not a timing, so that two runs
of one config (and a resumed run) compute with the same library. ``torch`` keeps the default
BLAS; ``onednn`` insists and is refused where it cannot apply.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from polyrl.core.errors import PolyrlError

__all__ = ["CpuMatmulError", "linear_library", "onednn_available", "onednn_linear", "resolve_cpu_matmul",
           "route_linears_through_onednn"]


class CpuMatmulError(PolyrlError):
    """``train.cpu_matmul: onednn`` cannot apply to this policy or machine."""


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _inner_product(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T (+ bias)`` for 2-D ``x [M, K]`` and ``weight [N, K]`` through oneDNN (strided views accepted)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        out = _inner_product(flat, weight, bias)
        ctx.save_for_backward(flat, weight)
        ctx.has_bias = bias is not None
        ctx.input_shape = x.shape
        return out.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        flat, weight = ctx.saved_tensors
        grad = grad_out.reshape(-1, weight.shape[0])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _inner_product(grad, weight.t()).reshape(ctx.input_shape)  # g W = g (Wᵀ)ᵀ
        if ctx.needs_input_grad[1]:
            grad_w = _inner_product(grad.t(), flat.t())  # gᵀ x = gᵀ (xᵀ)ᵀ
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(dim=0)
        return grad_x, grad_w, grad_b


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``torch.nn.functional.linear`` in fp32 through oneDNN, with its backward."""
    return _OneDNNLinear.apply(x, weight, bias)


def route_linears_through_onednn(module: torch.nn.Module) -> int:
    """Every ``nn.Linear`` in ``module`` computes through :func:`onednn_linear`; returns how many."""
    routed = 0
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.forward = _routed_forward(layer)
            routed += 1
    return routed


def linear_library(module: torch.nn.Module) -> str:
    """``onednn`` when every ``nn.Linear`` of ``module`` is routed, ``torch`` when none is, else ``mixed``."""
    routed = [layer.forward.__name__ == "onednn_forward" for layer in module.modules() if isinstance(layer, torch.nn.Linear)]
    return "onednn" if routed and all(routed) else ("mixed" if any(routed) else "torch")


def _routed_forward(layer: torch.nn.Linear):
    def onednn_forward(x: Tensor) -> Tensor:
        # Anything the oneDNN fp32 kernel is not for (another dtype or device) takes torch's path.
        if x.dtype == torch.float32 and layer.weight.dtype == torch.float32 and x.device.type == "cpu" and not torch.is_autocast_enabled("cpu"):
            return onednn_linear(x, layer.weight, layer.bias)
        return torch.nn.functional.linear(x, layer.weight, layer.bias)

    return onednn_forward


def resolve_cpu_matmul(setting: str, *, device: torch.device, compute_dtype: torch.dtype, compiled: bool) -> str:
    """``onednn`` or ``torch``: the library the learner's Linear layers will use (see the module doc)."""
    reasons = []
    if device.type != "cpu":
        reasons.append(f"the policy is on {device.type}, not the CPU")
    if compute_dtype != torch.float32:
        reasons.append(f"model.dtype computes in {str(compute_dtype).removeprefix('torch.')} (bf16 autocast already runs matmuls in oneDNN)")
    if compiled:
        reasons.append("train.compile is on (the compiled decoder runs Inductor's kernels)")
    if not onednn_available():
        reasons.append("this torch build has no oneDNN (torch.backends.mkldnn)")
    if setting == "torch":
        return "torch"
    if setting == "onednn" and reasons:
        raise CpuMatmulError("train.cpu_matmul: onednn cannot apply: " + "; ".join(reasons) + ". Use auto or torch.")
    return "torch" if reasons else "onednn"
