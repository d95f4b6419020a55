"""``train.device``: where the learner's models live, refused where the machine lacks it, and the
learner batch moving to that device whole.

This machine has no GPU, so the CUDA path itself is not run here: these tests pin the resolution,
the refusal, and that no tensor of a learner batch is left behind when it moves (checked on
torch's ``meta`` device, which every tensor can move to without a second real device).
"""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
from torch import Tensor

from polyrl.core.types import Completion
from polyrl.modeling.logprobs import PackedBatch, pack_completions
from polyrl.rollout.batches import LearnerBatch
from polyrl.runtime.devices import LearnerDeviceError, learner_device
from tests.training.learner_helpers import built, changed_fraction, snapshot

without_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


@without_cuda
def test_auto_is_the_cpu_here_and_an_absent_cuda_device_is_refused():
    assert learner_device("auto") == torch.device("cpu")
    assert learner_device("cpu") == torch.device("cpu")
    for setting in ("cuda", "cuda:1"):
        with pytest.raises(
            LearnerDeviceError,
            match=rf"train.device: '{setting}', but this torch sees no CUDA device.*allowed here: 'auto', 'cpu'",
        ):
            learner_device(setting)


@without_cuda
def test_an_arm_asking_for_cuda_is_refused_not_run_on_the_cpu(tmp_path, tiny_experiment):
    with pytest.raises(LearnerDeviceError, match="train.device: 'cuda'"):
        with built(tmp_path, tiny_experiment(train={"device": "cuda"})):
            pass


def test_an_arm_on_an_explicit_cpu_device_trains_there(tmp_path, tiny_experiment):
    with built(tmp_path, tiny_experiment(train={"steps": 1, "device": "cpu"})) as arm:
        assert {p.device for p in arm.learner.policy.parameters()} == {torch.device("cpu")}
        before = snapshot(arm.learner.policy)
        metrics = arm.loop(printer=lambda _line: None).step()
        assert torch.isfinite(torch.tensor(metrics["actor/loss"]))
        assert changed_fraction(before, arm.learner.policy) > 0.5


def test_a_learner_batch_moves_every_tensor_and_keeps_the_rest():
    completions = [
        Completion(prompt_ids=[5, 6], completion_ids=[7, 8, 9][:n], text="", sampling_logprobs=[-1.0] * n, finish_reason="length")
        for n in (3, 2)
    ]
    packed = pack_completions(completions, pad_token_id=0)
    packed = PackedBatch(
        **{**{f.name: getattr(packed, f.name) for f in fields(packed)}, "banned_token_ids": torch.tensor([1, 2])}
    )
    shape = packed.response_mask.shape
    settings = object()
    batch = LearnerBatch(
        packed=packed,
        old_logprobs=torch.zeros(shape),
        advantages=torch.ones(shape),
        ref_logprobs=torch.zeros(shape),
        old_values=torch.zeros(shape),
        returns=torch.ones(shape),
        metrics={"reward/mean": 0.5},
        policy_versions=torch.zeros(shape[0], dtype=torch.long),
        in_update_correction=settings,  # settings, not a tensor: carried as they are
        correction_rejected=torch.zeros(shape, dtype=torch.bool),
    )
    # Every field is set, so a tensor field added later and left out of ``to`` fails here.
    unset = [f.name for f in fields(batch) if getattr(batch, f.name) is None]
    unset += [f"packed.{f.name}" for f in fields(packed) if getattr(packed, f.name) is None]
    assert unset == ["packed.image_inputs"]  # a list of per-row dicts, moved by the forward that collates it

    moved = batch.to("meta")
    tensors = {f.name: getattr(moved, f.name) for f in fields(moved) if isinstance(getattr(moved, f.name), Tensor)}
    tensors |= {
        f"packed.{f.name}": getattr(moved.packed, f.name)
        for f in fields(moved.packed)
        if isinstance(getattr(moved.packed, f.name), Tensor)
    }
    # loss_mask, old_logprobs, advantages, ref_logprobs, old_values, returns, policy_versions,
    # correction_rejected; 7 of the packed batch
    assert len(tensors) == 8 + 7
    assert moved.in_update_correction is settings
    assert {name for name, tensor in tensors.items() if tensor.device.type != "meta"} == set()
    assert moved.metrics == {"reward/mean": 0.5}
    assert batch.advantages.device.type == "cpu" and batch.packed.input_ids.device.type == "cpu"  # the host copy is untouched
