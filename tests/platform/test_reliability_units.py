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

from polyrl.errors import PolyrlError
from polyrl.platform import checkpoint as ckpt
from polyrl.platform.tracking import STEP_MARKER, ExperimentTracker


def _tiny_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def _save(arm_dir, step, model, optimizer, **state):
    return ckpt.save_checkpoint(arm_dir / f"step_{step:06d}", step=step, models={"policy": model},
                                optimizers={"policy": optimizer}, state=state)


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
    with pytest.raises(ckpt.CheckpointWriteError, match=r"step_000002 .*No space left on device \(the disk is full\).*no earlier checkpoint"):
        _save(tmp_path / "arm", 2, model, optimizer)
    assert list((tmp_path / "arm").iterdir()) == []


# --- 11. NaN metrics are logged as NaN --------------------------------------------------------


def test_nan_and_inf_metrics_are_logged_and_only_non_numbers_dropped(tmp_path):
    import numpy as np

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    tracker = ExperimentTracker(uri, "nan")
    arm = tracker.start_arm(tracker.start_parent("nan").run_id, "a")
    arm.log_step(1, {"actor/loss": float("nan"), "actor/grad_norm": float("inf"), "reward/mean": np.float32(0.25),
                     "note": "text", "flag": True, "missing": None})
    arm.log_metrics(1, {"eval/accuracy": float("nan")})
    metrics = MlflowClient(uri).get_run(arm.run_id).data.metrics
    assert math.isnan(metrics["actor/loss"]) and math.isnan(metrics["eval/accuracy"])
    assert metrics["actor/grad_norm"] > 1e308  # MLflow stores +inf as the largest double
    assert metrics["reward/mean"] == 0.25 and metrics[STEP_MARKER] == 1.0
    assert not {"note", "flag", "missing"} & set(metrics)
