"""polyrl submit: experiments on a real local Ray cluster (no mocks)."""

from __future__ import annotations

import os

import pytest
from mlflow.tracking import MlflowClient

from polyrl.launch.ray_submit import absolute_tracking_uri, submit_experiment
from polyrl.tracking.mlflow_runs import find_arm_runs

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.ray]


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
def test_submit_two_arms_to_local_ray(tmp_path, tiny_experiment, write_experiment):
    ray = pytest.importorskip("ray")
    config = tiny_experiment(train={"steps": 2}, checkpoint={"every": 2})
    config["arms"] = {"grpo": {"objective": {"name": "grpo"}}, "dr_grpo": {"objective": {"name": "dr_grpo"}}}
    path = write_experiment(tmp_path, config)

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=100 * 1024 * 1024,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    try:
        result = submit_experiment(path, cpus_per_arm=1, parallel_arms=True)
    finally:
        ray.shutdown()

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
