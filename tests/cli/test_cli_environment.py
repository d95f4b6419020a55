"""Environment the polyrl command line sets before the libraries load."""

from __future__ import annotations

import os
import subprocess
import sys


def test_cli_turns_mlflow_telemetry_off_unless_the_user_set_it():
    # MLflow's telemetry thread set/unset _MLFLOW_TELEMETRY_SESSION_ID while requests iterated
    # os.environ, ending a `polyrl run` against a tracking server with a KeyError.
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_DISABLE_TELEMETRY", "PYTEST_CURRENT_TEST")}
    probe = (
        "import os, polyrl.cli.main; from mlflow.telemetry.utils import is_telemetry_disabled; "
        "print(os.environ['MLFLOW_DISABLE_TELEMETRY'], is_telemetry_disabled())"
    )
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["true", "True"]
    kept = subprocess.run(
        [sys.executable, "-c", "import os, polyrl.cli.main; print(os.environ['MLFLOW_DISABLE_TELEMETRY'])"],
        env=env | {"MLFLOW_DISABLE_TELEMETRY": "false"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert kept.stdout.strip() == "false"
