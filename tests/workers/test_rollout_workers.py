"""Rollout workers (engines/worker_pool.py) on a real local Ray cluster: N = 2 engines as Ray
actors sample exactly what one in-process engine samples, before and after weight syncs; a
worker that missed a sync is brought up to date; a worker killed while it generates is restarted,
re-synced and given its prompts again, and the call returns each sample once."""

from __future__ import annotations

import copy
import os
import signal
import threading
import time

import pytest
import torch

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.engines.base import build_rollout_engine
from polyrl.engines.worker_pool import RolloutWorkerPool, WorkerSpec, contiguous_slices

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm, pytest.mark.ray]

PROMPTS = [PromptSample(prompt=p) for p in ("12+7=", "hello", "a", "(3*4)-5=", "xyz")]
SETTINGS = SamplingSettings(n=4, temperature=1.0, max_tokens=16, seed=7)


def flat(groups):
    return [c for group in groups for c in group]


def assert_same_samples(got, expected):
    """Token ids, finish reasons and versions exactly; log-probs to float rounding (a batch of
    another shape sums in another order)."""
    got, expected = flat(got), flat(expected)
    assert len(got) == len(expected)
    assert [c.completion_ids for c in got] == [c.completion_ids for c in expected]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in expected]
    assert [c.policy_version for c in got] == [c.policy_version for c in expected]
    for a, b in zip(got, expected):
        assert a.sampling_logprobs == pytest.approx(b.sampling_logprobs, abs=1e-5)


def perturbed_weights(model_dir, seed: int) -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return [(name, tensor.clone()) for name, tensor in model.state_dict().items()]


@pytest.fixture(scope="module")
def engines(ray_cluster, random_policy_dir):
    """Two hf workers (batch_size=1: one row per generate call, slow enough to be killed while
    generating; per-row seeds make the samples independent of it) and the in-process engine."""
    spec = WorkerSpec("hf", str(random_policy_dir), {"seed": 0, "batch_size": 1}, num_cpus=1)
    pool = RolloutWorkerPool(spec, 2, seed=0)
    reference = build_rollout_engine("hf", str(random_policy_dir), seed=0)
    yield pool, reference
    pool.close()
    reference.close()


def sync_both(pool, reference, weights) -> int:
    version = pool.update_weights(copy.deepcopy(weights))
    assert reference.update_weights(weights) == version
    return version


def test_prompts_are_cut_into_contiguous_even_slices():
    assert contiguous_slices(5, 2) == [(0, 3), (3, 5)]
    assert contiguous_slices(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert contiguous_slices(1, 3) == [(0, 1)]  # fewer prompts than workers: the others idle


@pytest.mark.slow
def test_two_workers_sample_what_one_engine_samples(engines, random_policy_dir):
    pool, reference = engines
    assert len(set(pool.pids)) == 2 and os.getpid() not in pool.pids
    assert_same_samples(pool.generate(PROMPTS, SETTINGS), reference.generate(PROMPTS, SETTINGS))
    # After a sync every worker samples with the new weights: half the prompts go to each worker,
    # so one that kept the old weights would change its half.
    version = sync_both(pool, reference, perturbed_weights(random_policy_dir, seed=1))
    groups = pool.generate(PROMPTS, SETTINGS)
    assert {c.policy_version for c in flat(groups)} == {version}
    assert_same_samples(groups, reference.generate(PROMPTS, SETTINGS))
    greedy = SamplingSettings(n=2, temperature=0.0, max_tokens=8, seed=7)
    assert_same_samples(pool.generate(PROMPTS[:3], greedy), reference.generate(PROMPTS[:3], greedy))


@pytest.mark.slow
def test_a_worker_that_missed_a_sync_is_brought_up_to_date(engines, random_policy_dir):
    pool, reference = engines
    old = perturbed_weights(random_policy_dir, seed=2)
    sync_both(pool, reference, old)
    version = sync_both(pool, reference, perturbed_weights(random_policy_dir, seed=3))
    # Worker 1 misses the last sync: it goes back to the previous weights and version.
    ray = pool.ray
    ray.get(pool.workers[1].load_weights.remote(old, version - 1))
    resyncs = pool.resyncs
    groups = pool.generate(PROMPTS, SETTINGS)
    assert pool.resyncs == resyncs + 1  # it was sent the current weights, then asked again
    assert {c.policy_version for c in flat(groups)} == {version}  # no stale sample
    assert_same_samples(groups, reference.generate(PROMPTS, SETTINGS))


@pytest.mark.slow
def test_a_worker_killed_while_generating_is_restarted_and_its_prompts_sent_again(engines, random_policy_dir):
    psutil = pytest.importorskip("psutil")
    pool, reference = engines
    version = sync_both(pool, reference, perturbed_weights(random_policy_dir, seed=4))
    prompts = PROMPTS * 2  # worker 1 gets prompts 5..9: 5 x 8 rows x 48 tokens, one row per call
    settings = SamplingSettings(n=8, temperature=1.0, max_tokens=48, seed=9)
    victim = pool.ray.get(pool.workers[1].pid.remote())
    process = psutil.Process(victim)
    busy_before = sum(process.cpu_times()[:2])
    restarts, result, errors = pool.restarts, [], []

    def generate():
        try:
            result.append(pool.generate(prompts, settings))
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    thread = threading.Thread(target=generate)
    thread.start()
    deadline = time.monotonic() + 60
    # Kill it once it has spent CPU on this call (it idles before), i.e. while it generates.
    while sum(process.cpu_times()[:2]) < busy_before + 0.5:
        assert time.monotonic() < deadline and thread.is_alive(), "worker 1 never started generating"
        time.sleep(0.02)
    os.kill(victim, signal.SIGKILL)
    thread.join(timeout=300)
    assert not errors, errors
    assert pool.restarts == restarts + 1
    assert pool.ray.get(pool.workers[1].pid.remote()) != victim  # a new process
    assert pool.ray.get(pool.workers[1].policy_version.remote()) == version  # restarted at 0, brought up to date
    groups = result[0]
    assert len(groups) == len(prompts) and all(len(g) == settings.n for g in groups)  # none lost, none twice
    assert {c.policy_version for c in flat(groups)} == {version}
    assert_same_samples(groups, reference.generate(prompts, settings))


def test_weights_broadcast_over_a_gloo_group_reach_every_worker(engines, random_policy_dir):
    """rollout.weight_sync: broadcast on CPU: a real gloo group of this process (rank 0) and the
    two worker actors; nothing goes through the object store. (The workers' processes were
    replaced by the previous test's kill: the group is formed with the current ones.)"""
    import dataclasses

    pool, reference = engines
    pool.spec = dataclasses.replace(
        pool.spec, weight_sync="broadcast", broadcast_backend="gloo"
    )  # the same workers, the other way
    try:
        broadcasts = pool.broadcasts
        version = sync_both(pool, reference, perturbed_weights(random_policy_dir, seed=6))
        assert pool.broadcasts == broadcasts + 1 and pool._weights is None and pool._group.world_size == 3
        groups = pool.generate(PROMPTS, SETTINGS)
        assert {c.policy_version for c in flat(groups)} == {version}
        assert_same_samples(groups, reference.generate(PROMPTS, SETTINGS))  # both halves sampled with the broadcast weights
        group = pool._group
        version = sync_both(pool, reference, perturbed_weights(random_policy_dir, seed=7))
        assert pool._group is group and pool.broadcasts == broadcasts + 2  # the group serves every sync
        assert_same_samples(pool.generate(PROMPTS, SETTINGS), reference.generate(PROMPTS, SETTINGS))
    finally:
        pool.spec = dataclasses.replace(pool.spec, weight_sync="object_store")
        pool._close_group()


@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is None, reason="vllm is not installed")
def test_two_vllm_workers_sample_what_one_vllm_engine_samples(ray_cluster, random_policy_dir):
    """The reference is one of the workers generating the whole batch itself: one vLLM engine,
    without starting a third."""
    spec = WorkerSpec("vllm", str(random_policy_dir), {"seed": 0, "kv_cache_gb": 0.25, "max_model_len": 128}, num_cpus=1)
    pool = RolloutWorkerPool(spec, 2, seed=0)
    try:

        def one_engine(settings):
            version, groups = pool.ray.get(pool.workers[0].generate.remote(PROMPTS, settings, pool.policy_version))
            assert version == pool.policy_version
            return groups

        assert_same_samples(pool.generate(PROMPTS, SETTINGS), one_engine(SETTINGS))
        pool.update_weights(perturbed_weights(random_policy_dir, seed=5))
        groups = pool.generate(PROMPTS, SETTINGS)
        assert {c.policy_version for c in flat(groups)} == {1}
        assert_same_samples(groups, one_engine(SETTINGS))
    finally:
        pool.close()
