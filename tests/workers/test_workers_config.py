"""``rollout.workers``, ``rollout.worker_resources`` and a reward's ``remote``: accepted settings and
the refusals, each naming its field path (no Ray needed)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from polyrl.config.schema import ExperimentConfig
from polyrl.rewards import RewardSpec

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm, pytest.mark.ray]


def load(**rollout):
    return ExperimentConfig.model_validate({"name": "x", "rollout": {"prompts_per_step": 4, **rollout}})


def refusal(**rollout) -> tuple[str, str]:
    with pytest.raises(ValidationError) as caught:
        load(**rollout)
    (error,) = caught.value.errors()
    return ".".join(str(part) for part in error["loc"]), error["msg"]


def test_one_worker_is_the_default_and_workers_take_resources():
    assert load().rollout.workers == 1 and load().rollout.worker_resources is None
    config = load(workers=2, worker_resources={"num_cpus": 0.5, "num_gpus": 1, "placement_strategy": "SPREAD"})
    assert (
        config.rollout.workers,
        config.rollout.worker_resources.num_cpus,
        config.rollout.worker_resources.placement_strategy,
    ) == (2, 0.5, "SPREAD")


def test_settings_that_cannot_work_are_refused_with_their_field_path():
    path, message = refusal(worker_resources={"num_cpus": 2})
    assert path == "rollout.worker_resources" and "workers is 1" in message
    path, message = refusal(workers=5)
    assert path == "rollout.workers" and "4 prompts per step" in message and "1 to 4" in message
    path, message = refusal(workers=2, threads=2)
    assert path == "rollout.threads" and "worker_resources.num_cpus" in message
    assert refusal(workers=0)[0] == "rollout.workers"
    assert refusal(workers=2, worker_resources={"num_cpus": 0})[0] == "rollout.worker_resources.num_cpus"
    assert refusal(workers=2, worker_resources={"num_gpus": -1})[0] == "rollout.worker_resources.num_gpus"
    assert (
        refusal(workers=2, worker_resources={"placement_strategy": "RANDOM"})[0] == "rollout.worker_resources.placement_strategy"
    )
    assert refusal(workers=2, worker_resources={"cpus": 1})[0] == "rollout.worker_resources.cpus"


def test_a_reward_scores_remotely_on_request():
    assert RewardSpec(module="length").remote_resources is None
    assert RewardSpec(module="length", remote=True).remote_resources.num_cpus == 1.0
    assert RewardSpec(module="length", remote={"num_cpus": 0.5}).remote_resources.num_cpus == 0.5
    with pytest.raises(ValidationError, match="num_cpus"):
        ExperimentConfig.model_validate({"name": "x", "rewards": [{"module": "length", "remote": {"num_cpus": 0}}]})


def test_adapter_sync_is_refused_with_workers(tiny_experiment, tmp_path):
    """The adapter folder is written on the driver's disk; workers get merged weights instead.
    Refused before any engine or Ray starts."""
    from polyrl.config.base import ConfigError
    from polyrl.trainer.build_arm import build_arm

    config = ExperimentConfig.model_validate(
        tiny_experiment(rollout={"engine": "vllm", "workers": 2}, model={"lora": {"r": 4, "sync": "adapter"}})
    )
    with pytest.raises(ConfigError, match="model.lora.sync: adapter is not supported with rollout.workers: 2"):
        build_arm(config, arm="main", arm_dir=tmp_path / "runs")


def test_the_run_states_every_ray_actor_it_will_reserve(tiny_experiment):
    from polyrl.config.schema import resolve_arms
    from polyrl.trainer.build_arm import ray_demand

    config = tiny_experiment(
        rollout={"workers": 2, "worker_resources": {"num_cpus": 0.5}},
        train={"learner_workers": 2},
        rewards=[{"module": "length"}, {"module": "ppl_fluency", "remote": {"num_cpus": 0.25}}],
    )
    demand = ray_demand(resolve_arms(config)["main"])
    # 2 workers x 0.5 + 2 ranks x 1 (train.threads unset: 1) + 0.25 = 3.25 CPUs.
    assert demand.parts == (
        ("rollout.workers 2 × rollout.worker_resources", 1.0, 0.0),
        ("train.learner_workers 2 × train.threads 1", 2.0, 0.0),
        ("rewards[1].remote", 0.25, 0.0),
    )
    assert demand.cpus == 3.25
    assert ray_demand(resolve_arms(tiny_experiment())["main"]).parts == ()  # one process: no Ray


def test_weights_are_broadcast_where_learner_and_workers_are_on_cuda_and_the_choice_is_checked(tiny_experiment):
    from polyrl.config.schema import ConfigError, resolve_arms
    from polyrl.engines.weight_broadcast import resolve_weight_sync

    assert resolve_weight_sync("auto", learner_cuda=True, worker_gpus=1.0) == ("broadcast", "nccl")
    assert resolve_weight_sync("auto", learner_cuda=True, worker_gpus=0.0) == ("object_store", None)  # CPU workers
    assert resolve_weight_sync("auto", learner_cuda=False, worker_gpus=0.0) == ("object_store", None)  # this machine
    assert resolve_weight_sync("broadcast", learner_cuda=False, worker_gpus=0.0) == ("broadcast", "gloo")
    assert resolve_weight_sync("object_store", learner_cuda=True, worker_gpus=1.0) == ("object_store", None)
    assert (
        resolve_arms(tiny_experiment(rollout={"workers": 2, "weight_sync": "broadcast"}))["main"].rollout.weight_sync
        == "broadcast"
    )
    with pytest.raises(ConfigError, match=r"rollout.weight_sync.*workers is 1.*allowed here: auto, or workers > 1"):
        resolve_arms(tiny_experiment(rollout={"weight_sync": "broadcast"}))
    with pytest.raises(ConfigError, match=r"rollout.weight_sync"):
        resolve_arms(tiny_experiment(rollout={"workers": 2, "weight_sync": "nccl"}))
