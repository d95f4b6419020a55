"""A whole run with an environment whose step calls ``sys.exit(0)``: before, ``polyrl run`` ended
with exit status 0 having trained nothing; now the run stops with one error naming the
environment, the method, the row, the turn and the line. The run's first lines say how the
environment's tools are offered and its calls parsed."""

from __future__ import annotations

import pytest

EXITING_ENV = """
import sys

from polyrl.envs.builtins.calculator import CalculatorEnv


class ExitingEnv(CalculatorEnv):
    def step(self, text):
        sys.exit(0)
"""


@pytest.mark.slow
def test_sys_exit_in_step_stops_the_run_with_a_message(tmp_path, tiny_arch_dir, write_experiment, monkeypatch, capsys):
    from polyrl.envs import EnvFailedError
    from polyrl.launch.runner import run_experiment

    monkeypatch.chdir(tmp_path)
    (tmp_path / "exiting_env.py").write_text(EXITING_ENV)
    config = {
        "name": "exiting",
        "seed": 0,
        "model": {"path": str(tiny_arch_dir("qwen2"))},
        "data": {"source": "calculator"},
        "env": {"module": "exiting_env.py:ExitingEnv", "max_turns": 2, "max_episode_tokens": 64, "stop": ["e"]},
        "rollout": {"engine": "hf", "prompts_per_step": 1, "samples_per_prompt": 2, "max_tokens": 8, "max_model_len": 512},
        "train": {"steps": 1, "micro_batch_size": 2},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs")},
    }
    with pytest.raises(EnvFailedError) as caught:  # before: SystemExit(0)
        run_experiment(write_experiment(tmp_path, config), show_progress=False)
    message = str(caught.value)
    assert "environment 'exiting_env.py:ExitingEnv' called sys.exit(0) in step(text) on turn 1 of row id" in message
    assert "exiting_env.py, line 9" in message  # sys.exit(0)
    # The ChatML template of the tiny model renders no tools=: the plain-text protocol, parsed as hermes.
    printed = capsys.readouterr().out
    assert "env.tool_parser: tools are offered in the plain-text protocol" in printed
    assert "the chat template renders no tools=" in printed and "parsed as hermes" in printed
