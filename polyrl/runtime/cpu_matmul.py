"""The learner's fp32 Linear layers on CPU through oneDNN instead of torch's default BLAS (``train.cpu_matmul``).

Why: torch's CPU build runs an fp32 ``nn.Linear`` as an MKL ``sgemm``. MKL picks its kernels by
CPU vendor, and on an AMD EPYC (AVX-512 with full-width FMA units) it reaches about
half the rate that oneDNN (which dispatches on the instruction set, not the vendor) reaches on
the same fp32 products (``bench/bench_matmul.py``; figures: docs/benchmarks.md). vLLM's CPU backend already sends its
Linear layers to oneDNN (``dispatch_cpu_unquantized_gemm``), so the rollout side had this and
the learner did not. Matmuls are most of the 30m policy's update (torch profiler), so the GEMM
library bounds the update.

What changes: each ``nn.Linear`` of the routed module computes ``x Wᵀ + b`` and both gradients
(``∂x = g W``, ``∂W = gᵀ x``, ``∂b = Σ g``) with oneDNN's fp32 inner-product
(``torch.ops.mkldnn._linear_pointwise``, the op torch's own Inductor emits for CPU linears).
Same maths in fp32 (IEEE, no reduced-precision mode); only the summation order differs, so
results match torch's to fp32 rounding (tests: values and all three gradients to 1e-5
relative). Parameters, state dict, optimizer and weight sync are untouched: each layer's class
becomes a subclass of its own whose ``forward`` reads the layer it is called on, so a deep copy or
a pickled copy of a routed model (a teacher built by copying, a Ray actor's argument) stays routed
and computes with its own weights.

When: ``auto`` (the default) routes where torch's BLAS is MKL on a CPU that is not Intel's
(``vendor_id`` in ``/proc/cpuinfo``), the learner computes in fp32 and oneDNN is in this torch
build. That is the case the slow path comes from: on an Intel CPU MKL takes its own fast kernels,
and there oneDNN was the slower library (a 5th-gen Xeon, 30m update, because
oneDNN re-lays out the transposed operands of the backward products). A CPU whose vendor cannot
be read keeps torch's default. The choice is a rule about the machine and the build, not a
timing, so that two runs of one config on one machine (and a resumed run) compute with the same
library; it is logged with what decided it (``runtime.cpu_matmul``, ``runtime.cpu_vendor``,
``runtime.torch_blas``). ``torch``
keeps the default BLAS; ``onednn`` insists and is refused where it cannot apply. Under
``train.compile`` the same products run as registered custom ops, which Inductor calls as
opaque kernels while it fuses the element-wise work between them; without them a compiled
decoder would fall back to torch's BLAS and lose this module's gain.

Testing: the environment variable ``POLYRL_CPU_MATMUL`` (``onednn`` or ``torch``) replaces the
vendor rule of ``auto`` (only ``auto``; where oneDNN cannot apply, ``auto`` still keeps torch), so
the routing that ``auto`` gives every CPU that is not Intel's runs in a CI on an Intel machine
(``make test-other-matmul``, docs/testing.md), and the Intel choice on any other.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import Tensor

from polyrl.core.errors import PolyrlError

__all__ = [
    "AUTO_OVERRIDE_VARIABLE",
    "CpuMatmulError",
    "auto_override",
    "ProductTally",
    "cpu_vendor",
    "linear_library",
    "onednn_available",
    "onednn_linear",
    "onednn_linear_traceable",
    "resolve_cpu_matmul",
    "route_linears_through_onednn",
    "timed_products",
    "torch_blas",
]


class CpuMatmulError(PolyrlError):
    """``train.cpu_matmul: onednn`` cannot apply to this policy or machine."""


INTEL = "GenuineIntel"


@functools.cache  # a fact of the machine: read once per process, for the rule and for the run's params
def cpu_vendor() -> str | None:
    """The CPU's ``vendor_id`` (``GenuineIntel``, ``AuthenticAMD``, ...), ``None`` where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return None


@functools.cache
def torch_blas() -> str:
    """The BLAS torch's CPU matmuls call (``BLAS_INFO`` of its build: ``mkl``, ``open``, ...), lower-case."""
    for field in torch.__config__.show().replace(",", " ").split():
        if field.startswith("BLAS_INFO="):
            return field.removeprefix("BLAS_INFO=").lower()
    return "unknown"


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@dataclass
class ProductTally:
    """Wall seconds and FLOPs (2·M·N·K each) of the oneDNN products run inside :func:`timed_products`."""

    seconds: float = 0.0
    flop: float = 0.0
    products: int = 0

    @property
    def gflops(self) -> float:
        return self.flop / self.seconds / 1e9 if self.seconds else 0.0


_tally: ProductTally | None = None  # set only inside timed_products(): the untimed path costs one check


@contextlib.contextmanager
def timed_products() -> Iterator[ProductTally]:
    """Time every product this module runs in the block, in place (forward, input and weight
    gradients, with whatever layout copies oneDNN makes of strided operands).

    For ``bench/bench_step.py``: the update's own products timed where they run, so the share of
    the matmul peak they reach there is a number, and the rest of the update is the difference.
    """
    global _tally
    previous, _tally = _tally, ProductTally()
    try:
        yield _tally
    finally:
        _tally = previous


def _inner_product(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T (+ bias)`` for 2-D ``x [M, K]`` and ``weight [N, K]`` through oneDNN (strided views accepted)."""
    if _tally is None:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    start = time.perf_counter()
    out = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    _tally.seconds += time.perf_counter() - start
    _tally.flop += 2 * x.shape[0] * x.shape[1] * weight.shape[0]
    _tally.products += 1
    return out


def _grad_input(grad: Tensor, weight: Tensor) -> Tensor:
    """``∂x = g W`` for 2-D ``g [M, N]``: ``g (Wᵀ)ᵀ``, an inner product with the transposed view."""
    return _inner_product(grad, weight.t())


def _grad_weight(grad: Tensor, flat: Tensor) -> Tensor:
    """``∂W = gᵀ x`` for 2-D ``g [M, N]`` and ``x [M, K]``: ``gᵀ (xᵀ)ᵀ``."""
    return _inner_product(grad.t(), flat.t())


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
            grad_x = _grad_input(grad, weight).reshape(ctx.input_shape)
        if ctx.needs_input_grad[1]:
            grad_w = _grad_weight(grad, flat)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(dim=0)
        return grad_x, grad_w, grad_b


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``torch.nn.functional.linear`` in fp32 through oneDNN, with its backward."""
    return _OneDNNLinear.apply(x, weight, bias)


# The same three products as registered custom ops, for a decoder under ``torch.compile``:
# Inductor cannot lower the autograd function above (it asserts on the oneDNN op's arguments),
# but it calls a custom op as an opaque kernel and fuses the element-wise work around it.
# Eager code keeps the autograd function: its dispatch is cheaper (measured on the 3m update).
@torch.library.custom_op("polyrl::onednn_linear", mutates_args=())
def _linear_op(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return _inner_product(x.reshape(-1, x.shape[-1]), weight, bias).reshape(*x.shape[:-1], weight.shape[0])


@_linear_op.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("polyrl::onednn_linear_grad_input", mutates_args=())
def _grad_input_op(grad: Tensor, weight: Tensor) -> Tensor:
    return _grad_input(grad.reshape(-1, grad.shape[-1]), weight).reshape(*grad.shape[:-1], weight.shape[1])


@_grad_input_op.register_fake
def _(grad: Tensor, weight: Tensor) -> Tensor:
    return grad.new_empty((*grad.shape[:-1], weight.shape[1]))


@torch.library.custom_op("polyrl::onednn_linear_grad_weight", mutates_args=())
def _grad_weight_op(grad: Tensor, x: Tensor) -> Tensor:
    return _grad_weight(grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1]))


@_grad_weight_op.register_fake
def _(grad: Tensor, x: Tensor) -> Tensor:
    return grad.new_empty((grad.shape[-1], x.shape[-1]))


def _linear_op_context(ctx: Any, inputs: tuple[Tensor, Tensor, Tensor | None], output: Tensor) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _linear_op_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    x, weight = ctx.saved_tensors
    grad_x = _grad_input_op(grad, weight) if ctx.needs_input_grad[0] else None
    grad_w = _grad_weight_op(grad, x) if ctx.needs_input_grad[1] else None
    grad_b = grad.reshape(-1, grad.shape[-1]).sum(dim=0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return grad_x, grad_w, grad_b


_linear_op.register_autograd(_linear_op_backward, setup_context=_linear_op_context)


def onednn_linear_traceable(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """:func:`onednn_linear` as custom ops that ``torch.compile`` keeps as opaque kernels."""
    return _linear_op(x, weight, bias)


class _RoutedLinear(torch.nn.Linear):
    """The forward of a routed layer: its own ``weight`` and ``bias`` through oneDNN.

    Routing swaps a layer's class for a subclass of its own (:func:`_routed_class`) that puts this
    ``forward`` first, so the routed computation belongs to the class and reads the instance it is
    called on: a deep copy, a pickled layer (a Ray actor's argument, ``torch.save``) and a copy's
    gradients are the copy's own. (A ``forward`` set on the instance as a closure over the layer
    had been copied as it was, still computing with the source layer's weights.)
    """

    _unrouted: type[torch.nn.Linear]  # the layer's class before routing
    _traceable: bool  # custom ops that torch.compile keeps whole, rather than the autograd function

    def forward(self, x: Tensor) -> Tensor:
        weight, bias = self.weight, self.bias
        # Anything the oneDNN fp32 kernel is not for (another dtype or device, or no rows: oneDNN
        # has no primitive for an empty product) takes torch's path.
        if (
            x.dtype == torch.float32
            and weight.dtype == torch.float32
            and x.device.type == "cpu"
            and not torch.is_autocast_enabled("cpu")
            and x.numel() > 0
        ):
            return (onednn_linear_traceable if self._traceable else onednn_linear)(x, weight, bias)
        return torch.nn.functional.linear(x, weight, bias)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        # pickle names a class by module and name, and the routed classes are made at run time:
        # a routed layer pickles as its original class, the flag and its state instead.
        return _routed_instance, (self._unrouted, self._traceable), self.__getstate__()


@functools.cache  # one class per original class and flag: routed layers of one kind share a type
def _routed_class(unrouted: type[torch.nn.Linear], traceable: bool) -> type[_RoutedLinear]:
    name = f"OneDNN{unrouted.__name__}"
    return type(name, (_RoutedLinear, unrouted), {"_unrouted": unrouted, "_traceable": traceable, "__module__": __name__})


def _routed_instance(unrouted: type[torch.nn.Linear], traceable: bool) -> _RoutedLinear:
    """An empty routed layer for pickle and ``copy.deepcopy`` to fill with the state they restore."""
    routed = _routed_class(unrouted, traceable)
    return routed.__new__(routed)


def _routable(layer: torch.nn.Module) -> bool:
    """An ``nn.Linear`` whose forward is ``nn.Linear``'s: a subclass with a forward of its own (or a
    forward set on the instance, as accelerate's hooks do) computes something else and is left alone."""
    if not isinstance(layer, torch.nn.Linear) or "forward" in vars(layer):
        return False
    unrouted = layer._unrouted if isinstance(layer, _RoutedLinear) else type(layer)
    return unrouted.forward is torch.nn.Linear.forward


def route_linears_through_onednn(module: torch.nn.Module, *, traceable: bool = False) -> int:
    """Every ``nn.Linear`` in ``module`` computes through :func:`onednn_linear` (with ``traceable``,
    :func:`onednn_linear_traceable`, for a module that will be compiled); returns how many.

    Each layer's class becomes a subclass of its own whose ``forward`` reads the layer it is called
    on (:class:`_RoutedLinear`): parameters, buffers, hooks and ``isinstance`` are as before, and a
    deep copy or a pickled copy stays routed and computes with its own weights."""
    routed = 0
    for layer in module.modules():
        if _routable(layer):
            unrouted = layer._unrouted if isinstance(layer, _RoutedLinear) else type(layer)
            layer.__class__ = _routed_class(unrouted, traceable)
            routed += 1
    return routed


def linear_library(module: torch.nn.Module) -> str:
    """``onednn`` when every ``nn.Linear`` of ``module`` is routed, ``torch`` when none is, else ``mixed``."""
    routed = [isinstance(layer, _RoutedLinear) for layer in module.modules() if isinstance(layer, torch.nn.Linear)]
    return "onednn" if routed and all(routed) else ("mixed" if any(routed) else "torch")


AUTO_OVERRIDE_VARIABLE = "POLYRL_CPU_MATMUL"


def auto_override() -> str | None:
    """What ``POLYRL_CPU_MATMUL`` makes of ``auto``: ``onednn`` or ``torch`` in place of the vendor
    rule, ``None`` where it is unset or empty. For tests and CI: the routing ``auto`` picks on
    every CPU that is not Intel's runs on an Intel machine too (``make test-other-matmul``), and the
    Intel choice on another. An explicit ``onednn`` or ``torch`` is never overridden."""
    value = os.environ.get(AUTO_OVERRIDE_VARIABLE, "").strip().lower()
    if not value:
        return None
    if value not in ("onednn", "torch"):
        raise CpuMatmulError(
            f"{AUTO_OVERRIDE_VARIABLE}={value!r} (what train.cpu_matmul: auto resolves to): expected 'onednn', "
            "'torch', or unset for the vendor rule."
        )
    return value


def resolve_cpu_matmul(
    setting: str, *, device: torch.device, compute_dtype: torch.dtype, vendor: str | None = None, blas: str | None = None
) -> str:
    """``onednn`` or ``torch``: the library the learner's Linear layers will use (see the module doc).
    ``vendor`` and ``blas`` default to this machine's :func:`cpu_vendor` and :func:`torch_blas`;
    :func:`auto_override` (``POLYRL_CPU_MATMUL``) replaces their rule for ``auto``."""
    reasons = []
    if device.type != "cpu":
        reasons.append(f"the policy is on {device.type}, not the CPU")
    if compute_dtype != torch.float32:
        reasons.append(
            f"model.dtype computes in {str(compute_dtype).removeprefix('torch.')} (bf16 autocast already runs matmuls in oneDNN)"
        )
    if not onednn_available():
        reasons.append("this torch build has no oneDNN (torch.backends.mkldnn)")
    if setting == "torch":
        return "torch"
    if setting == "onednn":
        if reasons:
            raise CpuMatmulError("train.cpu_matmul: onednn cannot apply: " + "; ".join(reasons) + ". Use auto or torch.")
        return "onednn"
    forced = auto_override()
    if reasons:
        return "torch"
    if forced is not None:
        return forced
    vendor = cpu_vendor() if vendor is None else vendor
    blas = torch_blas() if blas is None else blas
    # Only MKL on a CPU known not to be Intel's: the vendor dispatch that makes MKL slow there.
    return "onednn" if blas == "mkl" and vendor not in (None, "", INTEL) else "torch"
