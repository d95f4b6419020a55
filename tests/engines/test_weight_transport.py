"""The weight-transport registry (engines/weight_transport.py): names are refused with the allowed
ones, a transport of the other kind is refused with the ones that fit, and a newly registered
transport is the one a sync goes through once named, from the collector down to the weights the
engine samples with (a real HF engine on a tiny random policy; the recording transport wraps the
real in-process reload, whose own tests are test_rollout_contract.py and test_rollout_hf.py)."""

from __future__ import annotations

import pytest
import torch

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.engines.base import build_rollout_engine
from polyrl.engines.weight_transport import (
    WEIGHT_TRANSPORTS,
    InProcessReload,
    WeightTransport,
    build_weight_transport,
    register_weight_transport,
    resolve_weight_sync,
    weight_transport_class,
)
from polyrl.rollout.collector import CollectSettings, RolloutCollector


@pytest.fixture(scope="module")
def engine(random_policy_dir):
    engine = build_rollout_engine("hf", str(random_policy_dir), seed=0)
    yield engine
    engine.close()


@pytest.fixture
def recording():
    """A transport registered as 'recording' for one test: it notes each push, then reloads in
    process as the real one does."""

    @register_weight_transport("recording")
    class RecordingReload(InProcessReload):
        pushes: list[tuple[list[str], int]] = []

        def push(self, named_tensors, version):
            named_tensors = list(named_tensors)
            self.pushes.append(([name for name, _ in named_tensors], version))
            super().push(named_tensors, version)

    yield RecordingReload
    del WEIGHT_TRANSPORTS["recording"]


def perturbed(engine, seed: int) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (name, tensor.detach().clone() + torch.randn(tensor.shape, generator=generator) * 0.05)
        for name, tensor in engine.model.state_dict().items()
    ]


def test_an_unknown_transport_is_refused_with_the_allowed_names():
    with pytest.raises(ValueError, match=r"unknown weight transport 'nccl_ipc'; allowed: broadcast, in_process, object_store"):
        weight_transport_class("nccl_ipc")


def test_rollout_weight_sync_takes_auto_or_a_worker_transport():
    with pytest.raises(ValueError, match=r"rollout.weight_sync: 'in_process'; allowed: auto, object_store, broadcast"):
        resolve_weight_sync("in_process", learner_cuda=False, worker_gpus=0.0)
    assert resolve_weight_sync("object_store", learner_cuda=True, worker_gpus=1.0) == ("object_store", None)


def test_an_engine_takes_only_transports_of_its_kind(engine):
    assert isinstance(engine.transport, InProcessReload) and engine.transport.name == "in_process"
    with pytest.raises(ValueError, match=r"'object_store' sends to Ray rollout workers.*allowed here: in_process"):
        build_weight_transport("object_store", engine)
    with pytest.raises(ValueError, match="allowed here: in_process"):
        engine.use_weight_transport("broadcast")
    assert engine.weight_transport_name == "in_process"  # a refused name changes nothing


def test_registering_a_taken_name_or_a_non_transport_is_refused():
    with pytest.raises(ValueError, match="'in_process' is already registered"):

        @register_weight_transport("in_process")
        class Other(InProcessReload):
            pass

    with pytest.raises(TypeError, match="not a WeightTransport subclass"):
        register_weight_transport("plain")(object)
    assert "plain" not in WEIGHT_TRANSPORTS


def test_a_registered_transport_carries_the_collectors_sync_once_named(engine, recording):
    collector = RolloutCollector(engine, None, lambda n: [], CollectSettings(prompts_per_step=1, samples_per_prompt=1))
    engine.use_weight_transport("recording")
    try:
        assert type(engine.transport) is recording and isinstance(engine.transport, WeightTransport)
        weights = perturbed(engine, seed=1)
        collector.sync_weights(iter(weights), version=5)
        assert recording.pushes == [([name for name, _ in weights], 5)]  # one push, every tensor, the version asked
        assert engine.policy_version == 5
        loaded = engine.model.state_dict()
        assert all(torch.equal(loaded[name], tensor) for name, tensor in weights)  # the real reload ran
        settings = SamplingSettings(n=2, temperature=1.0, max_tokens=4, seed=0)
        completions = [c for group in engine.generate([PromptSample(prompt="1+1=")], settings) for c in group]
        assert {c.policy_version for c in completions} == {5}
        collector.sync_weights(perturbed(engine, seed=2))  # no version: the engine's next
        assert recording.pushes[-1][1] == 6 and engine.policy_version == 6
    finally:
        engine.use_weight_transport("in_process")
    assert type(engine.transport) is InProcessReload  # named back: the default again
