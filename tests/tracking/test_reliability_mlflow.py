"""Reliability: a real `mlflow server` on 127.0.0.1 dies in the middle of a `polyrl run` and
comes back (or does not). Training goes on, logging calls wait in a file beside the arm's
checkpoints, and every step reaches MLflow exactly once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from run_control import child_env, start_child, wait_for

from polyrl.tracking.mlflow_runs import STEP_MARKER

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.mlflow_server]

COMPARED = ["reward/mean", "actor/loss", "rollout/response_length/mean"]


class MlflowServer:
    """``mlflow server`` on a fixed 127.0.0.1 port over one SQLite store, stoppable and restartable."""

    def __init__(self, folder: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.folder = folder
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        mlflow_bin = Path(sys.executable).with_name("mlflow")
        self.process = subprocess.Popen(
            [
                str(mlflow_bin),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--backend-store-uri",
                f"sqlite:///{self.folder / 'server.db'}",
                "--artifacts-destination",
                str(self.folder / "artifacts"),
                "--workers",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.stop()
        pytest.fail("mlflow server did not come up")

    def stop(self) -> None:
        """Kill the server and its workers at once, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait(timeout=30)
        self.process = None


@pytest.fixture
def server(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    srv = MlflowServer(folder)
    srv.start()
    yield srv
    srv.stop()


def _env() -> dict[str, str]:
    return child_env(POLYRL_MLFLOW_RETRY_S="0")


def _experiment(tiny_experiment, write_experiment, folder: Path, uri: str, steps: int) -> Path:
    config = tiny_experiment(
        name="outage",
        train={"steps": steps, "learning_rate": 3e-3, "micro_batch_size": 8},
        tracking={"uri": uri, "progress": False, "sample_table_every": 5},
        checkpoint={"dir": str(folder / "runs"), "every": 2, "keep": 10},
    )
    return write_experiment(folder, config)


def _start(folder: Path, hold: str, path: Path) -> subprocess.Popen:
    """The run, held after each step in ``hold`` (comma-separated) until 'go_<step>' appears."""
    return start_child(folder, _env(), "hold_after_step", hold, str(path), "--no-progress")


def _stop_server_after(step: int, server: MlflowServer, child: subprocess.Popen, folder: Path) -> None:
    """Once the held child has finished ``step``, kill the server and let the child go on."""
    wait_for(folder / f"at_step_{step}", child)
    server.stop()
    (folder / f"go_{step}").touch()


def _arm_run(client: MlflowClient):
    experiment = client.get_experiment_by_name("outage")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`polyrl.role` = 'arm'")
    assert len(runs) == 1
    return runs[0]


def _assert_all_steps_once(client: MlflowClient, run_id: str, steps: int) -> None:
    for key in [STEP_MARKER, *COMPARED]:
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == list(range(1, steps + 1)), key


@pytest.mark.slow
def test_server_killed_and_restarted_mid_run_loses_no_step(tmp_path, server, tiny_experiment, write_experiment):
    path = _experiment(tiny_experiment, write_experiment, tmp_path, server.url, steps=8)
    child = _start(tmp_path, "2,5", path)
    try:
        _stop_server_after(2, server, child, tmp_path)  # steps 3-5 (and step 5's sample table) happen without it
        wait_for(tmp_path / "at_step_5", child)
        server.start()
        (tmp_path / "go_5").touch()
        out, err = child.communicate(timeout=600)
    finally:
        child.kill()
    assert child.returncode == 0, (out[-2000:], err[-3000:])
    assert "Traceback" not in out + err
    assert f"MLflow at {server.url} is unreachable" in out and "training goes on" in out
    assert "answers again: uploaded" in out and "(steps 3-5)" in out
    arm_dir = tmp_path / "runs" / "outage" / "main"
    assert not list(arm_dir.glob("mlflow_buffer.*"))  # all delivered
    assert (arm_dir / "step_000004").is_dir()  # checkpoints went on during the outage (keep: 10)

    client = MlflowClient(server.url)
    run = _arm_run(client)
    assert run.info.status == "FINISHED"
    _assert_all_steps_once(client, run.info.run_id, 8)
    assert run.data.tags["polyrl.latest_checkpoint_step"] == "8"
    tables = {a.path for a in client.list_artifacts(run.info.run_id, "samples")}
    assert {"samples/step_00001.json", "samples/step_00005.json"} <= tables  # step 5's table was buffered, then sent


@pytest.mark.slow
def test_server_still_down_at_the_end_stops_with_checkpoints_and_resume_uploads_the_rest(
    tmp_path, server, tiny_experiment, write_experiment
):
    path = _experiment(tiny_experiment, write_experiment, tmp_path, server.url, steps=4)
    child = _start(tmp_path, "1", path)
    try:
        _stop_server_after(1, server, child, tmp_path)
        out, err = child.communicate(timeout=600)
    finally:
        child.kill()
    arm_dir = tmp_path / "runs" / "outage" / "main"
    assert child.returncode == 2, (out[-2000:], err[-3000:])
    assert "Traceback" not in out + err
    assert f"MLflow at {server.url} is unreachable: could not close run" in err
    assert "logging calls are kept in" in err and f"Continue with: polyrl run {path} --resume" in err
    assert (arm_dir / "step_000004").is_dir() and list(arm_dir.glob("mlflow_buffer.*.jsonl"))

    server.start()
    resumed = subprocess.run(
        [sys.executable, "-m", "polyrl.cli.main", "run", str(path), "--resume", "--no-progress"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "answers again: uploaded" in resumed.stdout
    client = MlflowClient(server.url)
    run = _arm_run(client)
    assert run.info.status == "FINISHED"
    _assert_all_steps_once(client, run.info.run_id, 4)
    assert not list(arm_dir.glob("mlflow_buffer.*")) and not list((tmp_path / "runs" / "outage").glob("mlflow_buffer.*"))
    parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.info.status == "FINISHED"
