"""MLflow tracking against a real SQLite store and a real `mlflow server` on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from run_control import free_port

from polyrl.analysis.compare import compare_experiment
from polyrl.launch.runner import run_experiment
from polyrl.runtime.cpu_matmul import cpu_vendor, resolve_cpu_matmul, torch_blas
from polyrl.runtime.devices import learner_device
from polyrl.runtime.host_memory import keep_freed_host_memory
from polyrl.tracking.mlflow_runs import STEP_MARKER, ExperimentTracker, resolve_tracking_uri

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.mlflow_server]


def test_default_store_is_sqlite_in_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri(None, workdir=tmp_path) == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert resolve_tracking_uri(None) == "http://127.0.0.1:5999"
    assert resolve_tracking_uri("sqlite:///x.db") == "sqlite:///x.db"  # the YAML wins


def test_steps_already_logged_are_not_logged_twice(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    tracker = ExperimentTracker(uri, "dup")
    parent = tracker.start_parent("dup")
    arm = tracker.start_arm(parent.run_id, "a")
    assert arm.log_step(1, {"reward/mean": 0.5})
    assert arm.log_step(2, {"reward/mean": 0.7})
    # A resumed process gets a fresh logger on the same run id.
    again = tracker.start_arm(parent.run_id, "a", resume_run_id=arm.run_id)
    assert not again.log_step(2, {"reward/mean": 0.7})
    assert again.log_step(3, {"reward/mean": 0.9, "text": "not a number"})
    client = MlflowClient(uri)
    assert [m.step for m in client.get_metric_history(arm.run_id, "reward/mean")] == [1, 2, 3]
    assert [m.step for m in client.get_metric_history(arm.run_id, STEP_MARKER)] == [1, 2, 3]
    assert client.get_metric_history(arm.run_id, "text") == []  # non-numbers are dropped (NaN is kept: test_reliability_units)


@pytest.fixture
def mlflow_server(tmp_path):
    port = free_port()
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    process = subprocess.Popen(
        [
            str(mlflow_bin),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'server.db'}",
            "--artifacts-destination",
            str(tmp_path / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        process.kill()
        pytest.fail("mlflow server did not come up")
    yield url
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.mark.slow
def test_mlflow_view_run_lines_go_to_the_log_not_the_console(mlflow_server, capsys, caplog):
    """MLflow prints "View run … at: …" on stdout when a server's run ends; the console is
    polyrl's (the log file is where library output goes). Before: both lines reached stdout."""
    tracker = ExperimentTracker(mlflow_server, "quiet")
    parent = tracker.start_parent("quiet")
    arm = tracker.start_arm(parent.run_id, "a")
    with caplog.at_level("INFO", logger="mlflow.tracking"):
        arm.finish()
        parent.finish_after_error("FAILED", "x")
    assert "View run" not in capsys.readouterr().out
    logged = [record.getMessage() for record in caplog.records if record.name == "mlflow.tracking"]
    assert any(line.startswith("🏃 View run a at: ") for line in logged), logged
    assert MlflowClient(mlflow_server).get_run(arm.run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_experiment_with_arms_logs_to_a_real_mlflow_server(
    tmp_path, tiny_experiment, mlflow_server, monkeypatch, write_experiment
):
    monkeypatch.chdir(tmp_path)
    config = tiny_experiment(name="served", train={"steps": 2}, tracking={"uri": mlflow_server, "progress": False})
    config["arms"] = {"grpo": {"objective": {"name": "grpo"}}, "dr_grpo": {"objective": {"name": "dr_grpo"}}}
    result = run_experiment(write_experiment(tmp_path, config), show_progress=False)

    client = MlflowClient(mlflow_server)
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert set(result.arm_run_ids) == {"grpo", "dr_grpo"}
    for arm, run_id in result.arm_run_ids.items():
        run = client.get_run(run_id)
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.params["objective.name"] == arm  # params: the flattened resolved config
        # Start-up is recorded per arm: the engine's and the whole build's seconds, and the thread choice.
        assert 0 < float(run.data.params["runtime.engine_startup_s"]) <= float(run.data.params["runtime.build_s"])
        assert int(run.data.params["runtime.torch_threads"]) >= 1
        assert run.data.params["runtime.learner_device"] == str(learner_device("auto"))  # train.device's default
        on_cpu = learner_device("auto").type == "cpu"  # a CPU learner keeps freed memory (glibc)
        assert run.data.params["runtime.host_malloc"] == (
            keep_freed_host_memory() if on_cpu else "unchanged: the learner is on a GPU"
        )
        assert run.data.params["runtime.rollout_threads"] == run.data.params["runtime.torch_threads"]  # default: the learner's
        # auto's choice, recorded with what it was made from
        assert run.data.params["runtime.cpu_matmul"] == resolve_cpu_matmul(
            "auto", device=torch.device("cpu"), compute_dtype=torch.float32
        )
        assert (
            run.data.params["runtime.cpu_vendor"] == (cpu_vendor() or "unknown")
            and run.data.params["runtime.torch_blas"] == torch_blas()
        )
        assert [m.step for m in client.get_metric_history(run_id, "reward/mean")] == [1, 2]
        artifacts = {a.path for a in client.list_artifacts(run_id)}
        assert "resolved_config.yaml" in artifacts
    assert "experiment.yaml" in {a.path for a in client.list_artifacts(parent.info.run_id)}

    comparison = compare_experiment("served", tracking_uri=mlflow_server, out_dir=tmp_path / "report")
    assert set(comparison.arms) == {"grpo", "dr_grpo"}
    assert {p.name for p in comparison.plot_paths} >= {"reward_mean.png", "rollout_response_length_mean.png", "actor_entropy.png"}
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "comparison")}
    assert "comparison/report.md" in logged and "comparison/reward_mean.png" in logged
    # The table's final values are the last logged values of each arm.
    last = client.get_metric_history(result.arm_run_ids["dr_grpo"], "reward/mean")[-1].value
    row = next(line for line in comparison.table_markdown.splitlines() if line.startswith("| dr_grpo "))
    assert f"{last:.4g}" in row
