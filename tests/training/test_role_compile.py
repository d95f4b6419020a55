"""``train.compile``: the compiled decoder layers compute the eager log-probs, share one graph,
train, and are refused where they would not apply."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM

from polyrl.core.types import Completion
from polyrl.modeling.logprobs import pack_completions, token_logprobs
from polyrl.modeling.probes import shortcut_refusal
from polyrl.runtime.compiled import CompileError, compile_decoder_layers
from polyrl.runtime.cpu_matmul import linear_library, onednn_available, resolve_cpu_matmul, route_linears_through_onednn
from tests.training.learner_helpers import built, changed_fraction, snapshot

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs g++")


def _batch(lengths: list[int]):
    completions = [
        Completion(
            prompt_ids=[5, 6, 7],
            completion_ids=[8 + (i + j) % 30 for j in range(n)],
            text="",
            sampling_logprobs=[],
            finish_reason="length",
        )
        for i, n in enumerate(lengths)
    ]
    return pack_completions(completions, pad_token_id=0)


@needs_compiler
@pytest.mark.slow
def test_compiled_decoder_layers_match_eager_logprobs_share_a_graph_and_train(random_policy_dir, tmp_path, tiny_experiment):
    eager = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32).eval()
    compiled = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32).eval()
    if onednn_available():  # as the learner does with train.cpu_matmul onednn: oneDNN custom ops inside the graph
        route_linears_through_onednn(compiled, traceable=True)
    layers = compile_decoder_layers(compiled, takes_images=False)
    assert len(layers) == len(compiled.get_decoder().layers) > 1
    assert all("_torchdynamo_orig_callable" in dir(layer.forward) for layer in compiled.get_decoder().layers)
    # The state dict keeps its eager names: checkpoints and weight sync see the same module.
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    # The set-up probe (modeling/probes.py) runs once per model, unpadded and without a mask: its
    # one-off graph is not the learner's; count only what the learner's batches compile.
    shortcut_refusal(compiled)
    counters.clear()
    for lengths in ([4, 9, 2], [12, 3, 7, 5]):  # two shapes: dynamic, no shape-specialised graph
        batch = _batch(lengths)
        with torch.no_grad():
            want, _ = token_logprobs(eager, batch)
            got, _ = token_logprobs(compiled, batch)
        assert torch.allclose(got, want, atol=1e-5, rtol=0), float((got - want).abs().max())
    # Every layer runs the same code, so one graph serves them all and both shapes. A graph per
    # layer would count len(layers) here, and past Dynamo's recompile limit (8) layers run eager.
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])

    config = tiny_experiment(train={"steps": 2, "compile": True})
    with built(tmp_path, config) as arm:
        assert all("_torchdynamo_orig_callable" in dir(layer.forward) for layer in arm.learner.policy.get_decoder().layers)
        assert linear_library(arm.learner.policy) == resolve_cpu_matmul(
            "auto", device=torch.device("cpu"), compute_dtype=torch.float32
        )
        before = snapshot(arm.learner.policy)
        loop = arm.loop(printer=lambda _line: None)
        metrics = [loop.step() for _ in range(2)]
        assert all(torch.isfinite(torch.tensor(m["actor/loss"])) for m in metrics)
        assert changed_fraction(before, arm.learner.policy) > 0.5


def test_compile_is_refused_for_image_text_policies(random_policy_dir):
    policy = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32)
    with pytest.raises(CompileError, match="text policies only"):
        compile_decoder_layers(policy, takes_images=True)
    assert not any("_torchdynamo_orig_callable" in dir(layer.forward) for layer in policy.get_decoder().layers)


def test_compile_is_refused_for_a_decoder_without_a_layer_list():
    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.Sequential(torch.nn.Linear(4, 4))

    class Policy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Decoder()

        def get_decoder(self):
            return self.model

    with pytest.raises(CompileError, match="no `layers` list"):
        compile_decoder_layers(Policy(), takes_images=False)
