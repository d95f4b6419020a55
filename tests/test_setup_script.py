"""The set-up script (`make setup`, which `make test` and CI run first) on a machine short of disk."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_setup_refuses_a_first_install_on_a_full_disk_and_says_what_it_needs(tmp_path):
    # CI once died 62 s into `make setup` with pip's bare "OSError: [Errno 28] No space left on
    # device" half-way through a wheel. The script now checks the free space before it creates
    # .venv. Asking for more than any disk has stands in for a full disk; PYTHON=false makes the
    # old script fail fast (without the message) instead of starting a real install.
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup_env.sh", tmp_path / "scripts" / "setup_env.sh")
    env = os.environ | {"POLYRL_SETUP_NEED_GB": "1000000", "PYTHON": "false"}
    result = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "setup_env.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "GB free on" in result.stderr and "needs about 1000000 GB" in result.stderr
    assert not (tmp_path / ".venv").exists()


def test_setup_refuses_a_free_disk_figure_that_is_not_a_whole_number(tmp_path):
    # Bash arithmetic on "6.5" would stop the script with a syntax error that names no setting.
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup_env.sh", tmp_path / "scripts" / "setup_env.sh")
    env = os.environ | {"POLYRL_SETUP_NEED_GB": "6.5", "PYTHON": "false"}
    result = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "setup_env.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "POLYRL_SETUP_NEED_GB must be a whole number of GB, got '6.5'" in result.stderr
