"""Reliability, fast parts: checkpoint look-ups and failed writes, metric values, run locks,
config comparison on resume and the MLflow reachability probe. Real files, real SQLite stores,
real sockets and processes; nothing here trains a model."""

from __future__ import annotations

import errno
import json
import math
import shutil

import pytest
import torch
from mlflow.tracking import MlflowClient
from run_control import free_port

from polyrl.core.errors import PolyrlError
from polyrl.tracking.mlflow_runs import STEP_MARKER, ExperimentTracker
from polyrl.trainer import checkpoint as ckpt


def _tiny_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def _save(arm_dir, step, model, optimizer, **state):
    return ckpt.save_checkpoint(
        arm_dir / f"step_{step:06d}", step=step, models={"policy": model}, optimizers={"policy": optimizer}, state=state
    )


# --- 2. a complete .partial folder is never a checkpoint ---------------------------------------


def test_complete_partial_folder_is_ignored_by_every_lookup_and_pruned(tmp_path):
    model, optimizer = _tiny_state()
    arm_dir = tmp_path / "arm"
    _save(arm_dir, 2, model, optimizer)
    _save(arm_dir, 4, model, optimizer)
    # Killed between the marker and the rename: a folder with every file, marker included.
    partial = arm_dir / "step_000006.partial"
    shutil.copytree(arm_dir / "step_000004", partial)
    (partial / ckpt.COMPLETE_MARKER).write_text(json.dumps({"step": 6}))
    (arm_dir / "step_notanumber").mkdir()  # a stray folder is no checkpoint either

    assert [p.name for p in ckpt.checkpoint_dirs(arm_dir)] == ["step_000002", "step_000004"]
    assert ckpt.latest_checkpoint(arm_dir).name == "step_000004"
    assert ckpt.checkpoint_step(partial) is None and ckpt.checkpoint_step(arm_dir / "step_000004") == 4

    ckpt.prune_checkpoints(arm_dir, keep=1)
    assert sorted(p.name for p in arm_dir.iterdir()) == ["step_000004", "step_notanumber"]


# --- 3. a failed checkpoint write (disk full) -------------------------------------------------


def test_disk_full_mid_checkpoint_names_it_removes_the_partial_and_keeps_the_previous(tmp_path, monkeypatch):
    model, optimizer = _tiny_state()
    arm_dir = tmp_path / "arm"
    _save(arm_dir, 2, model, optimizer)
    real_save_file = ckpt.save_file
    calls = []

    def save_file_until_full(tensors, filename):
        calls.append(filename)
        if len(calls) == 2:  # the optimizer file: half written, then the device is full
            with open(filename, "wb") as handle:
                handle.write(b"\0" * 64)
            raise OSError(errno.ENOSPC, "No space left on device", filename)
        return real_save_file(tensors, filename)

    monkeypatch.setattr(ckpt, "save_file", save_file_until_full)
    with pytest.raises(ckpt.CheckpointWriteError) as caught:
        _save(arm_dir, 4, model, optimizer)
    message = str(caught.value)
    assert isinstance(caught.value, PolyrlError)
    assert "step_000004" in message and str(arm_dir) in message and "No space left on device" in message
    assert "disk is full" in message and "step_000002, is kept" in message
    assert sorted(p.name for p in arm_dir.iterdir()) == ["step_000002"]  # no partial left using the space
    assert ckpt.read_checkpoint_info(arm_dir / "step_000002")["step"] == 2


def test_safetensors_io_error_is_reported_with_its_errno(tmp_path, monkeypatch):
    from safetensors import SafetensorError

    def full(tensors, filename):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    model, optimizer = _tiny_state()
    monkeypatch.setattr(ckpt, "save_file", full)
    with pytest.raises(
        ckpt.CheckpointWriteError, match=r"step_000002 .*No space left on device \(the disk is full\).*no earlier checkpoint"
    ):
        _save(tmp_path / "arm", 2, model, optimizer)
    assert list((tmp_path / "arm").iterdir()) == []


# --- 11. NaN metrics are logged as NaN --------------------------------------------------------


def test_nan_and_inf_metrics_are_logged_and_only_non_numbers_dropped(tmp_path):
    import numpy as np

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    tracker = ExperimentTracker(uri, "nan")
    arm = tracker.start_arm(tracker.start_parent("nan").run_id, "a")
    arm.log_step(
        1,
        {
            "actor/loss": float("nan"),
            "actor/grad_norm": float("inf"),
            "reward/mean": np.float32(0.25),
            "note": "text",
            "flag": True,
            "missing": None,
        },
    )
    arm.log_metrics(1, {"eval/accuracy": float("nan")})
    metrics = MlflowClient(uri).get_run(arm.run_id).data.metrics
    assert math.isnan(metrics["actor/loss"]) and math.isnan(metrics["eval/accuracy"])
    assert metrics["actor/grad_norm"] > 1e308  # MLflow stores +inf as the largest double
    assert metrics["reward/mean"] == 0.25 and metrics[STEP_MARKER] == 1.0
    assert not {"note", "flag", "missing"} & set(metrics)


# --- 8. one run per experiment folder ----------------------------------------------------------

LOCK_HOLDER = """
import sys, time
from polyrl.launch.run_lock import acquire_lock
lock = acquire_lock(sys.argv[1], experiment="x", command="holder")
print("locked", flush=True)
time.sleep(60)
"""


def test_lock_refuses_a_live_owner_and_takes_over_a_dead_one(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    from polyrl.launch.run_lock import LOCK_FILE, ExperimentLockedError, acquire_lock

    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ExperimentLockedError) as caught:
            acquire_lock(tmp_path, experiment="x")
        assert f"pid {holder.pid} on host {socket.gethostname()}" in str(caught.value) and "already running" in str(caught.value)
    finally:
        holder.kill()
        holder.wait()
    # SIGKILLed holder: the kernel dropped its flock; its record names a dead pid on this host.
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == holder.pid
    seen = []
    lock = acquire_lock(tmp_path, experiment="x", echo=seen.append)
    assert lock.took_over["pid"] == holder.pid and "gone" in seen[0]
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released: kept, emptied
    acquire_lock(tmp_path, experiment="x").release()


def test_lock_recorded_by_another_host_is_refused_with_how_to_clear_it(tmp_path):
    from polyrl.launch.run_lock import LOCK_FILE, ExperimentLockedError, acquire_lock

    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 4242, "host": "elsewhere.example", "started": "2025-01-01 00:00:00"}))
    with pytest.raises(
        ExperimentLockedError, match=r"pid 4242 on host elsewhere\.example.*another machine.*delete .*\.polyrl-run\.lock"
    ):
        acquire_lock(tmp_path, experiment="x")


# --- 6. config changes on resume ---------------------------------------------------------------


def _snapshot(**overrides):
    from polyrl.config.schema import ExperimentConfig
    from polyrl.launch.resume_config import config_snapshot

    return config_snapshot(ExperimentConfig.model_validate({"name": "e", **overrides}))


def test_resume_config_diff_names_each_changed_key_and_refuses_without_the_flag():
    from polyrl.config.schema import ConfigError
    from polyrl.launch.resume_config import check_resume_changes, resume_changes

    old = _snapshot(train={"learning_rate": 1e-3})
    new = _snapshot(train={"learning_rate": 5e-4}, objective={"name": "dr_grpo"})
    changes = resume_changes("main", old, new)
    assert [c.describe() for c in changes] == ["objective.name: 'grpo' → 'dr_grpo'", "train.learning_rate: 0.001 → 0.0005"]
    with pytest.raises(ConfigError) as caught:
        check_resume_changes({"main": changes}, finished=set(), allow=False, resume_steps={"main": 4})
    message = str(caught.value)
    assert "arm 'main' (resumes after step 4)" in message and "--allow-config-change" in message
    assert "train.learning_rate: 0.001 → 0.0005" in message and "objective.name: 'grpo' → 'dr_grpo'" in message
    check_resume_changes({"main": changes}, finished=set(), allow=True, resume_steps={"main": 4})  # applies
    check_resume_changes({"main": []}, finished=set(), allow=False, resume_steps={})  # nothing changed


def test_changes_that_cannot_apply_to_a_resumed_run_are_refused_even_with_the_flag():
    from polyrl.config.schema import ConfigError
    from polyrl.launch.resume_config import check_resume_changes, resume_changes

    old = _snapshot()
    new = _snapshot(
        seed=1,
        model={"builtin": {"size": "3m"}, "dtype": "bfloat16"},
        data={"limit": 10},
        train={"steps": 40},
        objective={"name": "ppo"},
    )
    changes = {"main": resume_changes("main", old, new)}
    with pytest.raises(ConfigError) as caught:
        check_resume_changes(changes, finished=set(), allow=True, resume_steps={"main": 2})
    message = str(caught.value)
    for line in (
        "seed: 0 → 1",
        "model.builtin.size: '0.3m' → '3m'",
        "model.dtype: 'float32' → 'bfloat16'",
        "data.limit: None → 10",
        "critic (advantage estimator needing values): 'no' → 'yes'",
    ):
        assert line in message, (line, message)
    assert "arm 'main': train.steps" not in message  # more steps for a running arm is fine


def test_a_finished_arm_may_train_longer_but_no_run_may_train_fewer_steps_than_its_checkpoint():
    from polyrl.config.schema import ConfigError
    from polyrl.launch.resume_config import check_resume_changes, resume_changes

    old = _snapshot(train={"steps": 20})
    longer = resume_changes("done", old, _snapshot(train={"steps": 40, "learning_rate": 1e-4}))
    check_resume_changes({"done": longer}, finished={"done"}, allow=True, resume_steps={"done": 20})  # before: refused
    for new, at, finished, said in (
        ({"steps": 19}, 20, {"done"}, "arm 'done': train.steps: 20 → 19 is below the step its checkpoint has reached (20)"),
        ({"steps": 3}, 4, set(), "arm 'done': train.steps: 20 → 3 is below the step its checkpoint has reached (4)"),
        ({"learning_rate": 1e-4}, 20, {"done"}, "arm 'done' already finished (step 20), so train.learning_rate"),
    ):
        for allow in (True, False):  # refused with or without the flag, never suggesting a flag that would refuse
            with pytest.raises(ConfigError) as caught:
                check_resume_changes(
                    {"done": resume_changes("done", old, _snapshot(train=new))},
                    finished=finished,
                    allow=allow,
                    resume_steps={"done": at},
                )
            assert said in str(caught.value) and "pass --allow-config-change" not in str(caught.value), str(caught.value)


def test_schedule_note_states_the_moved_horizon():
    from polyrl.config.schema import ExperimentConfig
    from polyrl.launch.resume_config import schedule_note

    config = ExperimentConfig.model_validate({"name": "e", "train": {"steps": 4, "lr_schedule": "cosine"}})
    # Cosine, no warm-up, p = (s - 1) / S: the old horizon 2 put step 2 at p = 1/2, factor (1 + cos(pi/2)) / 2 = 0.5;
    # the new horizon 4 puts step 3 at p = 2/4, factor 0.5 too, and step 2 at p = 1/4: (1 + cos(pi/4)) / 2 = 0.854.
    assert schedule_note(config, 2, 2) == (
        "train.steps 2 → 4: the cosine schedule's horizon moves from step 2 to step 4; the learning rate was 0.5 × "
        "train.learning_rate at step 2 and is 0.5 × at step 3, decaying to 0 × by step 4 (a run planned for 4 steps from the "
        "start was at 0.854 × at step 2)"
    )
    constant = ExperimentConfig.model_validate({"name": "e", "train": {"steps": 4}})
    assert (
        schedule_note(constant, 2, 2)
        == "train.steps 2 → 4: the learning-rate schedule is constant, so steps 3–4 train at train.learning_rate"
    )


# --- 5. an unreachable tracking server is reported at once -------------------------------------


def test_probe_reports_a_closed_port_in_seconds_and_passes_local_stores(tmp_path):
    import time

    from polyrl.tracking.mlflow_runs import TrackingUnavailableError, probe_tracking, unreachable_reason

    uri = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(TrackingUnavailableError, match=rf"cannot reach MLflow at {uri}: .*refused"):
        probe_tracking(uri)
    assert time.monotonic() - started < 5
    assert unreachable_reason(f"sqlite:///{tmp_path / 'm.db'}") is None


def test_a_local_store_error_is_raised_not_buffered(tmp_path):
    from mlflow.exceptions import MlflowException

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    tracker = ExperimentTracker(uri, "local")
    arm = tracker.start_arm(tracker.start_parent("local").run_id, "a", buffer_dir=tmp_path / "arm")
    arm.set_tags({"polyrl.x": "1"})
    with pytest.raises(MlflowException):
        arm.log_step(1, {"bad key with \u0000": 1.0})
    assert not (tmp_path / "arm").exists()


# --- 4. bounded MLflow calls -------------------------------------------------------------------


def test_mlflow_http_calls_get_bounded_timeouts_unless_the_user_set_them(tmp_path, monkeypatch):
    import os

    from polyrl.tracking.mlflow_runs import HTTP_DEFAULTS, make_client

    for key in HTTP_DEFAULTS:
        monkeypatch.setenv(key, "placeholder")  # so that monkeypatch restores the original state
        monkeypatch.delenv(key)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "7")
    make_client(f"sqlite:///{tmp_path / 'm.db'}")
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "7"  # the user's value wins
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2" and os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == "1"


def test_probe_of_a_server_that_accepts_but_never_answers_gives_up_at_its_timeout():
    import socket
    import time

    from polyrl.tracking.mlflow_runs import unreachable_reason

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts connections (kernel backlog) but never replies
        started = time.monotonic()
        reason = unreachable_reason(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=1.0)
        assert reason is not None and "timed out" in reason
        assert time.monotonic() - started < 3
