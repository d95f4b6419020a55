"""``train.cpu_matmul``: the learner's Linear layers through oneDNN compute torch's values and
gradients, the choice follows its rule (oneDNN for MKL on a CPU that is not Intel's), and an
explicit ``onednn`` that cannot apply is refused."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from polyrl.config.schema import ConfigError, resolve_arms
from polyrl.core.types import Completion
from polyrl.modeling.logprobs import pack_completions, token_logprobs
from polyrl.runtime import cpu_matmul
from polyrl.runtime.cpu_matmul import (
    CpuMatmulError,
    cpu_vendor,
    linear_library,
    onednn_linear,
    onednn_linear_traceable,
    resolve_cpu_matmul,
    route_linears_through_onednn,
    torch_blas,
)
from tests.training.learner_helpers import built, changed_fraction, snapshot

needs_onednn = pytest.mark.skipif(not cpu_matmul.onednn_available(), reason="this torch build has no oneDNN")


@needs_onednn
def test_onednn_linear_hand_computed_values_and_gradients():
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    weight = torch.tensor([[3.0, 4.0], [5.0, 6.0]], requires_grad=True)
    bias = torch.tensor([1.0, -1.0], requires_grad=True)
    y = onednn_linear(x, weight, bias)
    # y = x Wᵀ + b = [1·3 + 2·4 + 1, 1·5 + 2·6 − 1] = [12, 16]
    assert y.tolist() == [[12.0, 16.0]]
    y.sum().backward()  # g = [[1, 1]]
    assert x.grad.tolist() == [[8.0, 10.0]]  # g W = [3 + 5, 4 + 6]
    assert weight.grad.tolist() == [[1.0, 2.0], [1.0, 2.0]]  # gᵀ x: each output row gets x
    assert bias.grad.tolist() == [1.0, 1.0]  # Σ over rows of g


@needs_onednn
@pytest.mark.parametrize("linear", [onednn_linear, onednn_linear_traceable], ids=["autograd_function", "custom_op"])
def test_timed_products_counts_every_product_of_forward_and_backward_and_nothing_outside(linear):
    x = torch.randn(6, 4, requires_grad=True)
    weight = torch.randn(3, 4, requires_grad=True)
    linear(x, weight).sum().backward()  # outside the block: not counted anywhere
    with cpu_matmul.timed_products() as tally:
        linear(x, weight).sum().backward()
    # x [6, 4], W [3, 4]: forward x Wᵀ 2·6·4·3 = 144 FLOP, input grad g W 2·6·3·4 = 144,
    # weight grad gᵀ x 2·3·6·4 = 144: three products, 432 FLOP.
    assert tally.products == 3
    assert tally.flop == 432
    assert tally.seconds > 0 and tally.gflops > 0
    with cpu_matmul.timed_products() as only_forward:
        with torch.no_grad():
            linear(x, weight)
    assert (only_forward.products, only_forward.flop) == (1, 144)
    assert cpu_matmul._tally is None  # timing off again after the blocks


@needs_onednn
@pytest.mark.parametrize("linear", [onednn_linear, onednn_linear_traceable], ids=["autograd_function", "custom_op"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("transposed_input", [False, True])
def test_onednn_linear_matches_torch_values_and_all_gradients(linear, with_bias, transposed_input):
    torch.manual_seed(0)
    base = torch.randn(3, 48, 37) if transposed_input else torch.randn(3, 37, 48)
    weight = torch.randn(29, 48) / 48**0.5
    bias = torch.randn(29) if with_bias else None
    upstream = torch.randn(3, 37, 29)

    def run(fn):
        x = base.clone().requires_grad_()
        inputs = x.transpose(1, 2) if transposed_input else x  # a strided view when transposed
        w = weight.clone().requires_grad_()
        b = bias.clone().requires_grad_() if bias is not None else None
        out = fn(inputs, w, b)
        (out * upstream).sum().backward()
        return out.detach(), x.grad, w.grad, None if b is None else b.grad

    want = run(torch.nn.functional.linear)
    got = run(linear)
    for name, g, w in zip(("output", "input grad", "weight grad", "bias grad"), got, want):
        if w is None:
            assert g is None
            continue
        assert g.shape == w.shape
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-5), (name, float((g - w).abs().max()))


@needs_onednn
def test_routed_linear_takes_torchs_path_for_what_onednn_cannot_compute():
    layer = torch.nn.Linear(4, 3)
    route_linears_through_onednn(layer)
    rows = torch.zeros(2, 0, 4, requires_grad=True)
    empty = layer(rows)  # no rows: oneDNN has no primitive for the weight gradient's empty product
    empty.sum().backward()
    assert empty.shape == (2, 0, 3) and rows.grad.shape == (2, 0, 4)
    assert torch.equal(layer.weight.grad, torch.zeros(3, 4)) and torch.equal(layer.bias.grad, torch.zeros(3))
    doubled = layer.double()(torch.ones(1, 4, dtype=torch.float64))  # fp64 (test models): torch's kernel
    assert doubled.dtype == torch.float64 and torch.allclose(
        doubled, torch.nn.functional.linear(torch.ones(1, 4, dtype=torch.float64), layer.weight, layer.bias)
    )


def _batch():
    completions = [
        Completion(
            prompt_ids=[5, 6, 7],
            completion_ids=[8 + (i + j) % 30 for j in range(n)],
            text="",
            sampling_logprobs=[],
            finish_reason="length",
        )
        for i, n in enumerate([6, 11, 3, 9])
    ]
    return pack_completions(completions, pad_token_id=0)


@needs_onednn
def test_routed_policy_gives_torch_logprobs_and_gradients(random_policy_dir):
    reference = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32).eval()
    routed = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32).eval()
    linears = sum(isinstance(m, torch.nn.Linear) for m in routed.modules())
    assert linear_library(routed) == "torch"
    assert route_linears_through_onednn(routed) == linears > 0
    assert linear_library(routed) == "onednn"
    # The parameters are the same objects under the same names: optimizer, checkpoints and weight sync are unaffected.
    assert routed.state_dict().keys() == reference.state_dict().keys()
    batch = _batch()
    grads = []
    for model in (reference, routed):
        logprobs, _ = token_logprobs(model, batch)
        logprobs.sum().backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    want, _ = token_logprobs(reference, batch)
    got, _ = token_logprobs(routed, batch)
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4), name


def test_the_choice_follows_its_rule(monkeypatch):
    monkeypatch.delenv("POLYRL_CPU_MATMUL", raising=False)  # the rule itself, not make test-other-matmul's override
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(cpu_matmul, "onednn_available", lambda: True)
    fp32 = {"device": cpu, "compute_dtype": torch.float32}
    # auto: oneDNN only for MKL on a CPU known not to be Intel's (MKL's vendor dispatch is the slow path).
    assert resolve_cpu_matmul("auto", **fp32, vendor="AuthenticAMD", blas="mkl") == "onednn"
    assert resolve_cpu_matmul("auto", **fp32, vendor="HygonGenuine", blas="mkl") == "onednn"
    assert resolve_cpu_matmul("auto", **fp32, vendor="GenuineIntel", blas="mkl") == "torch"
    # An unreadable vendor keeps torch's default. (vendor=None means "read this machine's", so the
    # reading itself is made to fail: passing None had tested the machine the suite ran on.)
    with monkeypatch.context() as unreadable:
        unreadable.setattr(cpu_matmul, "cpu_vendor", lambda: None)
        assert resolve_cpu_matmul("auto", **fp32, blas="mkl") == "torch"
    assert resolve_cpu_matmul("auto", **fp32, vendor="AuthenticAMD", blas="open") == "torch"  # not MKL: no vendor dispatch
    # An explicit choice is honoured whatever the vendor.
    assert resolve_cpu_matmul("onednn", **fp32, vendor="GenuineIntel", blas="mkl") == "onednn"
    assert resolve_cpu_matmul("torch", **fp32, vendor="AuthenticAMD", blas="mkl") == "torch"
    for kwargs in ({"device": cuda, "compute_dtype": torch.float32}, {"device": cpu, "compute_dtype": torch.bfloat16}):
        assert resolve_cpu_matmul("auto", **kwargs, vendor="AuthenticAMD", blas="mkl") == "torch"
        with pytest.raises(CpuMatmulError, match="onednn cannot apply"):
            resolve_cpu_matmul("onednn", **kwargs)
    monkeypatch.setattr(cpu_matmul, "onednn_available", lambda: False)
    assert resolve_cpu_matmul("auto", **fp32, vendor="AuthenticAMD", blas="mkl") == "torch"
    with pytest.raises(CpuMatmulError, match="no oneDNN"):
        resolve_cpu_matmul("onednn", **fp32)


def test_polyrl_cpu_matmul_replaces_autos_vendor_rule_and_nothing_else(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "onednn_available", lambda: True)
    fp32 = {"device": torch.device("cpu"), "compute_dtype": torch.float32}
    monkeypatch.setenv("POLYRL_CPU_MATMUL", "onednn")  # make test-other-matmul on Intel: the non-Intel default on any CPU
    assert resolve_cpu_matmul("auto", **fp32, vendor="GenuineIntel", blas="mkl") == "onednn"
    assert resolve_cpu_matmul("auto", **fp32, vendor="AuthenticAMD", blas="open") == "onednn"
    assert resolve_cpu_matmul("torch", **fp32, vendor="AuthenticAMD", blas="mkl") == "torch"  # explicit: kept
    # Where oneDNN cannot apply, auto still keeps torch (never an error).
    assert resolve_cpu_matmul("auto", device=torch.device("cpu"), compute_dtype=torch.bfloat16) == "torch"
    monkeypatch.setenv("POLYRL_CPU_MATMUL", " Torch ")  # the Intel choice on a CPU that is not Intel's
    assert resolve_cpu_matmul("auto", **fp32, vendor="AuthenticAMD", blas="mkl") == "torch"
    assert resolve_cpu_matmul("onednn", **fp32, vendor="AuthenticAMD", blas="mkl") == "onednn"
    monkeypatch.setenv("POLYRL_CPU_MATMUL", "")  # empty: the rule
    assert resolve_cpu_matmul("auto", **fp32, vendor="AuthenticAMD", blas="mkl") == "onednn"
    monkeypatch.setenv("POLYRL_CPU_MATMUL", "mkl")
    with pytest.raises(CpuMatmulError, match="POLYRL_CPU_MATMUL='mkl'.*'onednn', 'torch', or unset"):
        resolve_cpu_matmul("auto", **fp32)


@pytest.mark.skipif(platform.machine() != "x86_64" or not Path("/proc/cpuinfo").exists(), reason="reads an x86 Linux CPU")
def test_this_machine_is_read_for_the_rule(monkeypatch):
    monkeypatch.delenv("POLYRL_CPU_MATMUL", raising=False)
    vendors = {
        line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("vendor_id")
    }
    assert cpu_vendor() in vendors and len(vendors) == 1
    assert torch_blas() == "mkl"  # PyPI's x86 CPU wheel links MKL
    expected = "onednn" if cpu_vendor() != "GenuineIntel" and cpu_matmul.onednn_available() else "torch"
    assert resolve_cpu_matmul("auto", device=torch.device("cpu"), compute_dtype=torch.float32) == expected


def test_an_explicit_onednn_that_would_not_run_is_refused_with_its_field():
    with pytest.raises(ConfigError) as error:
        resolve_arms({"name": "x", "model": {"dtype": "bfloat16"}, "train": {"cpu_matmul": "onednn"}})
    message = str(error.value)
    assert "train.cpu_matmul" in message and "model.dtype is bfloat16" in message and "'auto', 'torch'" in message


@needs_onednn
def test_arm_routes_policy_and_reference_through_onednn_and_trains(tmp_path, tiny_experiment):
    config = tiny_experiment(train={"steps": 2, "kl_coef": 0.05, "cpu_matmul": "onednn"})
    with built(tmp_path, config) as arm:
        assert linear_library(arm.learner.policy) == linear_library(arm.reference) == "onednn"
        before = snapshot(arm.learner.policy)
        loop = arm.loop(printer=lambda _line: None)
        metrics = [loop.step() for _ in range(2)]
        assert all(torch.isfinite(torch.tensor(m["actor/loss"])) for m in metrics)
        assert changed_fraction(before, arm.learner.policy) > 0.5
        # Same fp32 maths as the engine's: the sampler/learner gap stays at rounding level.
        assert metrics[0]["rollout/logprob_gap"] < 1e-4
    with built(tmp_path / "torch", tiny_experiment(train={"steps": 2, "cpu_matmul": "torch"})) as arm:
        assert linear_library(arm.learner.policy) == "torch"
    with built(
        tmp_path / "auto", tiny_experiment(train={"steps": 2, "kl_coef": 0.05})
    ) as arm:  # the default follows the rule here
        auto = resolve_cpu_matmul("auto", device=torch.device("cpu"), compute_dtype=torch.float32)
        assert linear_library(arm.learner.policy) == linear_library(arm.reference) == auto
