"""train.threads takes effect even after vLLM's CPU worker has replaced torch.set_num_threads."""

from __future__ import annotations

import pytest
import torch

from polyrl.runtime.threads import set_torch_threads, torch_threads

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm]


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch._C.set_num_threads(before)


def test_threads_are_set_when_torch_set_num_threads_is_a_no_op(monkeypatch, restore_threads):
    # What vLLM's CPU worker does once it has bound its threads (vllm/v1/worker/cpu_worker.py).
    monkeypatch.setattr(torch, "set_num_threads", lambda count: None)
    assert set_torch_threads(1) == 1
    assert torch.get_num_threads() == 1
    with torch_threads(2):  # the warm-ups' thread cap uses the same setter
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1


@pytest.mark.slow
def test_threads_are_set_after_a_real_vllm_engine_starts(random_policy_dir, restore_threads):
    from polyrl.engines.base import build_rollout_engine

    engine = build_rollout_engine("vllm", str(random_policy_dir), seed=0, kv_cache_gb=0.25, max_model_len=128)
    try:
        torch.set_num_threads(1)  # the public setter: a no-op once vLLM is up
        assert set_torch_threads(1) == 1 and torch.get_num_threads() == 1
        assert set_torch_threads(2) == 2 and torch.get_num_threads() == 2
    finally:
        engine.close()


def test_rollout_threads_default_to_the_learners_and_config_wins():
    from polyrl.trainer.build_rollout import rollout_threads

    assert rollout_threads(None, learner_threads=2) == 2
    assert rollout_threads(1, learner_threads=2) == 1  # rollout.threads is taken as given


def test_generation_runs_at_rollout_threads_and_the_learner_gets_its_own_back(tmp_path, tiny_experiment, restore_threads):
    """A real arm (HF engine, tiny policy): the engine sees rollout.threads while it generates;
    afterwards the learner's count is back, and both are logged as the run's params."""
    from tests.training.learner_helpers import built

    config = tiny_experiment(train={"steps": 1, "threads": 2}, rollout={"threads": 1})
    with built(tmp_path, config) as arm:
        engine = arm.collector.engine
        seen: list[int] = []
        generate = engine.generate

        def recording_generate(prompts, settings):
            seen.append(torch.get_num_threads())
            return generate(prompts, settings)

        engine.generate = recording_generate
        arm.collector.collect(1)
        assert seen == [1] and torch.get_num_threads() == 2
