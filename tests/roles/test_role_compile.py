"""``train.compile``: the compiled decoder computes the eager log-probs, trains, and is refused
where it would not apply."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from polyrl.algos.logprobs import pack_completions, token_logprobs
from polyrl.core.types import Completion
from polyrl.roles.compiled import CompileError, compile_decoder
from polyrl.roles.cpu_matmul import linear_library, onednn_available, resolve_cpu_matmul, route_linears_through_onednn
from tests.roles.learner_helpers import built, changed_fraction, snapshot

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs g++")


def _batch(lengths: list[int]):
    completions = [Completion(prompt_ids=[5, 6, 7], completion_ids=[8 + (i + j) % 30 for j in range(n)], text="",
                              sampling_logprobs=[], finish_reason="length")
                   for i, n in enumerate(lengths)]
    return pack_completions(completions, pad_token_id=0)


@needs_compiler
@pytest.mark.slow
def test_compiled_decoder_matches_eager_logprobs_and_trains(random_policy_dir, tmp_path, tiny_experiment):
    eager = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32).eval()
    compiled = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32).eval()
    if onednn_available():  # as the learner does with train.cpu_matmul onednn: oneDNN custom ops inside the graph
        route_linears_through_onednn(compiled, traceable=True)
    decoder = compile_decoder(compiled, takes_images=False)
    assert compiled.get_decoder() is decoder and "_torchdynamo_orig_callable" in dir(decoder.forward)
    # The state dict keeps its eager names: checkpoints and weight sync see the same module.
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    for lengths in ([4, 9, 2], [12, 3, 7, 5]):  # two shapes: dynamic, no shape-specialised graph
        batch = _batch(lengths)
        with torch.no_grad():
            want, _ = token_logprobs(eager, batch)
            got, _ = token_logprobs(compiled, batch)
        assert torch.allclose(got, want, atol=1e-5, rtol=0), float((got - want).abs().max())

    config = tiny_experiment(train={"steps": 2, "compile": True})
    with built(tmp_path, config) as arm:
        assert "_torchdynamo_orig_callable" in dir(arm.learner.policy.get_decoder().forward)
        assert linear_library(arm.learner.policy) == resolve_cpu_matmul("auto", device=torch.device("cpu"), compute_dtype=torch.float32)
        before = snapshot(arm.learner.policy)
        loop = arm.loop(printer=lambda _line: None)
        metrics = [loop.step() for _ in range(2)]
        assert all(torch.isfinite(torch.tensor(m["actor/loss"])) for m in metrics)
        assert changed_fraction(before, arm.learner.policy) > 0.5


def test_compile_is_refused_for_image_text_policies(random_policy_dir):
    policy = AutoModelForCausalLM.from_pretrained(str(random_policy_dir), dtype=torch.float32)
    with pytest.raises(CompileError, match="text policies only"):
        compile_decoder(policy, takes_images=True)
    assert "_torchdynamo_orig_callable" not in dir(policy.get_decoder().forward)
