"""A run killed with SIGKILL resumes from its last checkpoint into the same MLflow runs and
ends with the same metrics as an uninterrupted run of the same seed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from polyrl.tracking.mlflow_runs import STEP_MARKER

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # SIGKILL and resume: whole runs

KILL_AFTER_STEP_5 = """
import os, signal, sys
from polyrl.trainer import loop
from polyrl.cli.main import app

original_step = loop.TrainingLoop.step

def step_then_die(self):
    metrics = original_step(self)
    if self.step_index == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return metrics

loop.TrainingLoop.step = step_then_die
sys.argv = ["polyrl", "run", sys.argv[1], "--no-progress"]
app()
"""

COMPARED = ["reward/mean", "actor/loss", "actor/grad_norm", "rollout/response_length/mean", "actor/entropy", "actor/approx_kl"]


def _polyrl(*args, cwd):
    return [sys.executable, "-m", "polyrl.cli.main", *args]


def _arm_run(client, experiment):
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`polyrl.role` = 'arm'")
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def _history(client, run_id, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def _config(tiny_experiment, folder: Path, engine: str):
    return tiny_experiment(
        name="resumable",
        rollout={"engine": engine, "max_tokens": 16},
        train={"steps": 6, "learning_rate": 3e-3, "micro_batch_size": 8},
        tracking={"uri": f"sqlite:///{folder / 'mlflow.db'}", "progress": False},
        checkpoint={"dir": str(folder / "runs"), "every": 2},
    )


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path, tiny_experiment, engine, write_experiment, monkeypatch):
    from polyrl.launch.runner import run_experiment

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)

    # The uninterrupted reference runs in this process (the kill and the resume are the CLI's and
    # stay subprocesses): a run sets its own seeds and torch threads, so where it runs is moot.
    straight = tmp_path / "straight"
    straight.mkdir()
    path = write_experiment(straight, _config(tiny_experiment, straight, engine))
    with monkeypatch.context() as patch:
        patch.chdir(straight)
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        result = run_experiment(path, show_progress=False)
    assert not result.failed, result.failed

    killed = tmp_path / "killed"
    killed.mkdir()
    path = write_experiment(killed, _config(tiny_experiment, killed, engine))
    uri = f"sqlite:///{killed / 'mlflow.db'}"
    # The run SIGKILLs itself right after step 5 reached MLflow: the last checkpoint is step 4,
    # so the resumed run recomputes step 5 (already logged: must not be duplicated) and then
    # runs step 6. Killing from inside makes the point of death exact on any machine speed;
    # polling from outside raced a fast run to its end.
    process = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_STEP_5, str(path)],
        cwd=killed,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=600,
    )
    assert process.returncode == -signal.SIGKILL

    checkpoints = sorted(p.name for p in (killed / "runs" / "resumable" / "main").glob("step_*"))
    assert checkpoints[-1] == "step_000004", checkpoints
    resumed = subprocess.run(
        _polyrl("run", str(path), "--resume", "--no-progress", cwd=killed),
        cwd=killed,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 4" in resumed.stdout

    straight_client = MlflowClient(f"sqlite:///{straight / 'mlflow.db'}")
    killed_client = MlflowClient(uri)
    straight_run = _arm_run(straight_client, "resumable")
    killed_run = _arm_run(killed_client, "resumable")  # the same run continued: still one arm run
    assert killed_run.info.status == "FINISHED"
    for key in COMPARED + [STEP_MARKER]:
        a = _history(straight_client, straight_run.info.run_id, key)
        b = _history(killed_client, killed_run.info.run_id, key)
        assert [s for s, _ in b] == [1, 2, 3, 4, 5, 6], (key, b)  # none missing, none twice
        for (_, x), (_, y) in zip(a, b):
            assert y == pytest.approx(x, rel=1e-6, abs=1e-9), (key, a, b)
