"""polyrl submit: experiments on a real local Ray cluster (no mocks). The submissions share one
cluster (module scope): each starts its own Ray worker process per arm (max_calls=1), so a
fresh cluster per test would only add the cluster's start-up."""

from __future__ import annotations

import os

import pytest
from mlflow.tracking import MlflowClient

from polyrl.launch.ray_submit import absolute_tracking_uri, submit_experiment
from polyrl.tracking.mlflow_runs import find_arm_runs
from tests.ray_support import in_process_cluster

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.ray]


@pytest.fixture(scope="module")
def local_ray():
    """2 CPUs: the two arms (or seeds) of a submission run side by side, one CPU each."""
    yield from in_process_cluster(num_cpus=2, object_store_mb=100)


def test_absolute_tracking_uri(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_tracking_uri("sqlite:///mlflow.db") == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert absolute_tracking_uri("sqlite:////srv/mlflow.db") == "sqlite:////srv/mlflow.db"
    assert absolute_tracking_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_an_arm_on_cuda_without_ray_gpus_is_refused_before_the_cluster_starts(tmp_path, tiny_experiment, write_experiment):
    ray = pytest.importorskip("ray")
    from polyrl.config.schema import ConfigError

    config = tiny_experiment()
    config["arms"] = {"cpu": {}, "gpu": {"train": {"device": "cuda:0"}}}
    path = write_experiment(tmp_path, config)
    with pytest.raises(ConfigError, match=r"train.device: cuda in arm\(s\) gpu, but --gpus-per-arm is 0 .*pass --gpus-per-arm 1"):
        submit_experiment(path, gpus_per_arm=0)
    assert not ray.is_initialized()


@pytest.mark.slow
def test_submit_two_arms_to_local_ray(local_ray, tmp_path, tiny_experiment, write_experiment):
    config = tiny_experiment(train={"steps": 2}, checkpoint={"every": 2})
    config["arms"] = {"grpo": {"objective": {"name": "grpo"}}, "dr_grpo": {"objective": {"name": "dr_grpo"}}}
    path = write_experiment(tmp_path, config)

    result = submit_experiment(path, cpus_per_arm=1, parallel_arms=True)

    client = MlflowClient(result.tracking_uri)
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["polyrl.launcher"] == "ray"
    arm_runs = {
        run.data.tags["polyrl.arm"]: run for run in find_arm_runs(client, parent.info.experiment_id, result.parent_run_id)
    }
    assert set(arm_runs) == {"grpo", "dr_grpo"} == set(result.arm_run_ids)
    pids = set()
    for arm, run in arm_runs.items():
        assert run.info.run_id == result.arm_run_ids[arm]
        assert run.info.status == "FINISHED", arm
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train/step")] == [1, 2]
        assert len(client.get_metric_history(run.info.run_id, "reward/mean")) == 2
        assert run.data.params["objective.name"] == arm
        assert run.data.params["train.threads"] == "1"  # one Ray CPU, one torch thread
        # trained in a Ray worker process, not here
        pid = int(run.data.tags["polyrl.ray.pid"])
        assert pid != os.getpid()
        assert run.data.tags["polyrl.ray.node_id"]
        pids.add(pid)
        assert result.final_metrics[arm]  # the last step's metrics came back through ray.get
    assert len(pids) == 2  # one worker process per arm (max_calls=1)
    assert (result.experiment_dir / "grpo").is_dir() and (result.experiment_dir / "dr_grpo").is_dir()


@pytest.mark.slow
def test_submit_spreads_arm_seed_runs_over_local_ray(local_ray, tmp_path, tiny_experiment, write_experiment, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tiny_experiment(name="rayseeds", train={"steps": 1}, checkpoint={"every": 1})
    path = write_experiment(tmp_path, config)
    result = submit_experiment(path, cpus_per_arm=1, parallel_arms=True, seeds_option="2")
    client = MlflowClient(result.tracking_uri)
    assert client.get_run(result.parent_run_id).info.status == "FINISHED"
    arm_run = client.get_run(result.arm_run_ids["main"])
    assert arm_run.data.tags["mlflow.parentRunId"] == result.parent_run_id and arm_run.info.status == "FINISHED"
    assert set(result.seed_run_ids) == {"main/seed_0", "main/seed_1"} == set(result.final_metrics)
    pids, finals = set(), []
    for seed in (0, 1):
        run = client.get_run(result.seed_run_ids[f"main/seed_{seed}"])
        assert run.data.tags["mlflow.parentRunId"] == arm_run.info.run_id and run.info.status == "FINISHED"
        assert run.data.params["seed"] == str(seed)
        pids.add(int(run.data.tags["polyrl.ray.pid"]))
        finals.append(client.get_metric_history(run.info.run_id, "reward/mean")[-1].value)
        assert (tmp_path / "runs" / "rayseeds" / "main" / f"seed_{seed}" / "step_000001").is_dir()
    assert len(pids) == 2  # one Ray worker per arm × seed
    assert arm_run.data.metrics["reward/mean"] == pytest.approx(sum(finals) / 2, rel=1e-9)
