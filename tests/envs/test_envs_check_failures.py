"""``polyrl envs check`` on environments that exit, hang or return rewards a run refuses, and
``polyrl eval`` episode options without ``--env``.

Before: ``sys.exit(0)`` in ``step`` made ``envs check`` exit 0 printing nothing; a hanging
``step`` hung it; ``--limit 0`` checked one row; an ``np.float32`` reward failed the check
although the run took it; ``polyrl eval --max-turns 2`` without ``--env`` was silently ignored."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from polyrl.cli.main import app

ENV = """
import sys
import time

import numpy as np

from polyrl.envs import Step


class Env:
    def __init__(self, how="ok"):
        self.how = how

    def start(self, row):
        return [{"role": "user", "content": row.prompt}]

    def step(self, text):
        if self.how == "exit":
            sys.exit(0)
        if self.how == "hang":
            time.sleep(30)
        if self.how == "nan":
            return Step(reward=float("nan"), done=True)
        return Step(reward=np.float32(0.5), done=True)
"""


@pytest.fixture
def env_file(tmp_path):
    (tmp_path / "env.py").write_text(ENV)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(3)))
    return tmp_path


def check(folder, how, *extra):
    args = ["envs", "check", f"{folder / 'env.py'}:Env", "--data", str(folder / "rows.jsonl"), "--turn", "hi"]
    return CliRunner().invoke(app, [*args, "--params", json.dumps({"how": how}), *extra])


def test_sys_exit_in_step_fails_the_check(env_file):
    out = check(env_file, "exit")
    assert out.exit_code == 1, out.output
    assert "called sys.exit(0) in step(text)" in " ".join(out.output.split())


def test_a_hanging_step_fails_within_the_timeout(env_file):
    started = time.perf_counter()
    out = check(env_file, "hang", "--timeout", "0.3")
    assert out.exit_code == 1, out.output
    assert time.perf_counter() - started < 5
    assert "did not return within 0.3 s" in " ".join(out.output.split())


def test_rewards_are_held_to_the_runs_rule(env_file):
    out = check(env_file, "nan")
    assert out.exit_code == 1 and "returned reward nan" in " ".join(out.output.split()), out.output
    out = check(env_file, "ok")  # np.float32: a number the run accepts
    assert out.exit_code == 0 and "all checks passed" in out.output, out.output


def test_limit_zero_is_refused(env_file):
    out = check(env_file, "ok", "--limit", "0")
    assert out.exit_code == 2 and "--limit" in out.output, out.output


@pytest.mark.parametrize("option", [["--max-turns", "2"], ["--max-episode-tokens", "64"]])
def test_eval_episode_options_without_env_are_refused(option):
    out = CliRunner().invoke(app, ["eval", "--model", "x", "--suite", "calculator", *option])
    assert out.exit_code == 2 and f"{option[0]}: apply only with --env" in " ".join(out.output.split()), out.output


def test_eval_refuses_an_empty_stop_string():
    out = CliRunner().invoke(app, ["eval", "--model", "x", "--suite", "calculator", "--env", "guess_number", "--env-stop", ""])
    assert out.exit_code == 2 and "empty stop string" in out.output, out.output
