"""What `polyrl run` shows: its own lines by default, the libraries' logs in <run folder>/polyrl.log."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polyrl.engines.vllm_quiet import FAILED_LOAD_MESSAGE, RELOAD_LOGGER, WEIGHT_SYNC_FAILURES, WeightSyncFilter

ROOT = Path(__file__).resolve().parents[2]
# Markers of library log lines: vLLM's and transformers' logger names as our file formatter writes
# them, vLLM's own prefix when it configures its handler, torch's C++ warnings, vLLM's load bar.
LIBRARY_MARKERS = ("vllm.", "(MainProcess pid=", "[W", "Loading safetensors checkpoint shards", "py.warnings")


def _record(layer: str) -> logging.LogRecord:
    return logging.LogRecord(RELOAD_LOGGER, logging.WARNING, "layerwise.py", 266, FAILED_LOAD_MESSAGE, (layer,), None)


def test_weight_sync_filter_drops_rotary_cache_warning_and_escalates_a_real_miss(caplog):
    weight_filter = WeightSyncFilter()
    before = WEIGHT_SYNC_FAILURES["QKVParallelLinear"]
    assert weight_filter.filter(_record("RotaryEmbedding")) is False
    assert weight_filter.filter(_record("Llama3RotaryEmbedding")) is False
    assert WEIGHT_SYNC_FAILURES["RotaryEmbedding"] == 0  # a computed cache is not a missed weight
    with caplog.at_level(logging.WARNING, logger="polyrl.weight_sync"):
        assert weight_filter.filter(_record("QKVParallelLinear")) is False  # re-emitted, not dropped
    assert WEIGHT_SYNC_FAILURES["QKVParallelLinear"] == before + 1
    escalated = [r for r in caplog.records if r.name == "polyrl.weight_sync"]
    assert len(escalated) == 1 and "QKVParallelLinear" in escalated[0].getMessage()
    # Any other vLLM record passes untouched.
    other = logging.LogRecord(RELOAD_LOGGER, logging.INFO, "x.py", 1, "Reloading weights inplace...", (), None)
    assert weight_filter.filter(other) is True


def _run_cli(tmp_path: Path, config_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "COLUMNS": "250"}
    env.pop("VLLM_CONFIGURE_LOGGING", None)
    return subprocess.run(
        [sys.executable, "-m", "polyrl.cli.main", "run", str(config_path), *extra],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.vllm
def test_run_shows_own_lines_and_sends_library_logs_to_the_run_folder(tmp_path, tiny_experiment, write_experiment):
    config = tiny_experiment(
        rollout={"engine": "vllm", "prompts_per_step": 2, "samples_per_prompt": 2, "max_tokens": 8},
        train={"steps": 2, "micro_batch_size": 4},
        checkpoint={"every": 100},
    )
    config_path = write_experiment(tmp_path, config)
    log_file = tmp_path / "runs" / "tiny" / "polyrl.log"

    quiet = _run_cli(tmp_path, config_path)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    shown = quiet.stdout + quiet.stderr
    assert "experiment tiny" in quiet.stdout and "main: reward" in quiet.stdout  # the CLI's own lines
    assert not [m for m in LIBRARY_MARKERS if m in shown], shown[-3000:]
    logged = log_file.read_text()
    assert "INFO vllm." in logged  # vLLM's start-up INFO logs
    assert "utils.cpp" in logged or "[W" in logged or "NUMA" in logged or "WARNING vllm." in logged
    # Two steps mean at least one weight sync: the rotary-cache warning is gone at its source.
    assert "Reloading weights inplace" in logged
    assert "Failed to load weights" not in logged and "Failed to load weights" not in shown

    verbose = _run_cli(tmp_path, config_path, "--verbose")
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert "INFO vllm." in verbose.stdout + verbose.stderr
    assert "main: reward" in verbose.stdout
    # The log keeps both commands, each under its own header (a new run does not move it aside).
    assert log_file.read_text().count("===== ") == 2
