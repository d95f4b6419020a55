"""Resume as a way to train longer: a finished arm's ``train.steps`` may grow (the schedule's moved
horizon said and recorded), never drop below its checkpoint, and a resume with nothing left to
train reports the last logged values instead of NaN."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from run_control import polyrl_here

from polyrl.tracking.mlflow_runs import ROLE_TAG, STEP_MARKER


def _polyrl(folder: Path, monkeypatch, *args: str):
    """``polyrl run ARGS --no-progress`` in this process, from ``folder``: what is checked is the
    command's messages and records, and five interpreter start-ups were most of this test's time."""
    return polyrl_here(folder, monkeypatch, "run", *args, "--no-progress")


@pytest.mark.slow
def test_a_finished_arm_trains_longer_never_shorter_and_a_no_step_resume_reports_its_last_values(
    tmp_path, tiny_experiment, write_experiment, monkeypatch
):
    config = tiny_experiment(
        name="longer",
        train={"steps": 2, "lr_schedule": "cosine"},
        checkpoint={"every": 2},
        rollout={"prompts_per_step": 2, "samples_per_prompt": 2},
    )
    path = str(write_experiment(tmp_path, config))
    first = _polyrl(tmp_path, monkeypatch, path)
    assert first.returncode == 0, first.stderr[-3000:]

    # Fewer steps than the checkpoint has: refused, with or without the flag (before: accepted, a summary
    # of NaNs, the arm FINISHED at 2 steps while its recorded config said 1).
    for flags in (["--allow-config-change"], []):
        shorter = _polyrl(tmp_path, monkeypatch, path, "--resume", *flags, "--set", "train.steps=1")
        assert shorter.returncode == 2, shorter.stdout[-2000:] + shorter.stderr[-2000:]
        assert "train.steps: 2 → 1 is below the step its checkpoint has reached (2)" in shorter.stderr, shorter.stderr

    # Train the finished arm on to step 4 (before: refused, "already finished").
    longer = _polyrl(tmp_path, monkeypatch, path, "--resume", "--allow-config-change", "--set", "train.steps=4")
    assert longer.returncode == 0, longer.stdout[-3000:] + longer.stderr[-3000:]
    out = " ".join(longer.stdout.split())  # rich wraps long lines
    assert "main finished at step 2; training it on to step 4" in out, out
    assert "resumed from step 2" in out
    assert "the cosine schedule's horizon moves from step 2 to step 4" in out, out
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("longer")
    run = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{ROLE_TAG}` = 'arm'")[0]
    assert run.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, STEP_MARKER)) == [1, 2, 3, 4]
    assert "horizon moves from step 2 to step 4" in run.data.tags["polyrl.schedule_change.step_000002"]
    assert run.data.tags["polyrl.config_change.step_000002"] == "train.steps: 2 → 4"

    # A resume with no step left to train (as after a kill between the last checkpoint and the
    # arm's record): the summary shows the values step 4 logged (before: reward nan · accuracy nan).
    state_path = tmp_path / "runs" / "longer" / "experiment.json"
    state = json.loads(state_path.read_text())
    state["finished"] = []
    state_path.write_text(json.dumps(state))
    again = _polyrl(tmp_path, monkeypatch, path, "--resume", "--set", "train.steps=4")
    assert again.returncode == 0, again.stderr[-3000:]
    last_reward = client.get_metric_history(run.info.run_id, "reward/mean")[-1].value
    assert f"main: reward {last_reward:.3f}" in again.stdout and "nan" not in again.stdout, again.stdout
