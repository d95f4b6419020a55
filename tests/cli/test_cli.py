"""The `polyrl` console script, run as a user runs it: in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

POLYRL = str(Path(sys.executable).with_name("polyrl"))
COMMANDS = [
    [],
    ["run"],
    ["submit"],
    ["validate"],
    ["compare"],
    ["ui"],
    ["eval"],
    ["objectives"],
    ["objectives", "list"],
    ["rewards"],
    ["rewards", "list"],
    ["rewards", "new"],
    ["rewards", "check"],
    ["jobs"],
    ["jobs", "list"],
    ["jobs", "logs"],
    ["jobs", "stop"],
    ["scale-model"],
]


def polyrl(*args, cwd=None):
    return subprocess.run([POLYRL, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_console_script_runs():
    result = polyrl("--help")
    assert result.returncode == 0, result.stderr
    for command in ("run", "validate", "compare", "ui", "eval", "objectives", "rewards", "submit", "jobs", "scale-model"):
        assert command in result.stdout


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "polyrl")
def test_every_command_has_help(command):
    from typer.testing import CliRunner

    from polyrl.cli.main import app

    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_objectives_list_names_every_objective_and_its_paper():
    result = polyrl("objectives", "list")
    assert result.returncode == 0, result.stderr
    for name in ("ppo", "grpo", "dr_grpo", "dapo", "gspo", "gspo_token", "bapo"):
        assert name in result.stdout
    assert "2503.20783" in result.stdout.replace("\n", "")  # Dr.GRPO's arXiv id


def test_bad_yaml_is_a_message_naming_the_field_not_a_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nrollout: {engine: tgi, temperature: -1}\n")
    for command in ("validate", "run"):
        result = polyrl(command, str(path), cwd=tmp_path)
        assert result.returncode == 2
        assert "rollout.engine" in result.stderr and "'vllm'" in result.stderr
        assert "rollout.temperature" in result.stderr and "> 0" in result.stderr
        assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.slow
def test_missing_file_and_unknown_experiment_are_clear_errors(tmp_path):
    result = polyrl("validate", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2 and "no such file" in result.stderr
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'm.db'}"
    MlflowClient(tracking_uri=store).search_experiments()  # an existing store without that experiment
    result = polyrl("compare", "never_ran", "--tracking-uri", store, cwd=tmp_path)
    assert (
        result.returncode == 2 and "no polyrl experiment named 'never_ran'" in result.stderr and "Traceback" not in result.stderr
    )
    result = polyrl("run", str(tmp_path / "nope.yaml"), "--resume", cwd=tmp_path)
    assert result.returncode == 2


def test_validate_reports_unresolvable_reward_modules(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("name: x\nrewards: [{module: 'no_such_pkg.mod:Reward'}]\n")
    result = polyrl("validate", str(path))
    assert result.returncode == 2
    assert "rewards[0].module" in result.stderr and "no_such_pkg" in result.stderr


def test_validate_tells_arms_apart_that_differ_only_in_how_rewards_combine():
    # gdpo_caption's arms differ only in advantage.reward_aggregation: before, both printed the
    # same line ("aggregation=default", the loss's), so validate could not show what is compared.
    experiment = Path(__file__).resolve().parents[2] / "experiments" / "gdpo_caption.yaml"
    result = polyrl("validate", str(experiment))
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "combined by sum" in out and "combined by gdpo" in out and "loss_aggregation=default" in out


def test_validate_accepts_the_demo_and_prints_each_arm():
    demo = Path(__file__).resolve().parents[2] / "experiments" / "grpo_vs_drgrpo.yaml"
    result = polyrl("validate", str(demo))
    assert result.returncode == 0, result.stderr
    assert "arm grpo" in result.stdout and "arm dr_grpo" in result.stdout
