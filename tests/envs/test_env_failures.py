"""An environment's own code failing, and its rewards, checked as reward modules' are.

Before: ``start`` reading a missing column or ``step`` raising ended a run in a 64-86-line
traceback; ``sys.exit(0)`` in ``step`` ended ``polyrl run`` with exit status 0 and nothing
trained; a ``step`` that never returned hung the run; NaN and inf rewards were trained on and
an ``np.float32`` reward broke the sample table's JSON."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.envs import EnvFailedError, Step
from polyrl.envs.base import checked_reward
from polyrl.envs.builtins.guess_number import GuessNumberEnv
from polyrl.envs.calls import EnvStuckError
from polyrl.rollout.episodes import EpisodeRunner, EpisodeSettings
from tests.envs.scripted import ScriptedEngine, chatml_tokenizer

ROW = PromptSample("Guess a number from 1 to 10.", fields={"target": 7, "id": "g-3"})


class FailingEnv:
    """Answers its first turn as ``how`` says (rewards as given)."""

    tools: list = []

    def __init__(self, how: str = "raise", reward: object = 1.0):
        self.how, self.reward = how, reward

    def start(self, row):
        return [{"role": "user", "content": row.prompt}]

    def step(self, text):
        if self.how == "raise":
            return {"a": 1}["b"]  # the line the message must name
        if self.how == "exit":
            raise SystemExit(0)
        if self.how == "hang":
            time.sleep(30)
        return Step(reward=self.reward, done=True)


def play(tiny_arch_dir, make_env, **settings):
    tokenizer = chatml_tokenizer(tiny_arch_dir)
    runner = EpisodeRunner(
        make_env, tokenizer, EpisodeSettings(max_turns=2, max_episode_tokens=200, env_name="my_env", **settings)
    )
    return runner.run(ScriptedEngine(tokenizer, ["7<|im_end|>"], "<|im_end|>"), [ROW], SamplingSettings(n=1))


def test_start_reading_a_missing_column_names_the_environment_and_the_row(tiny_arch_dir):
    tokenizer = chatml_tokenizer(tiny_arch_dir)
    runner = EpisodeRunner(GuessNumberEnv, tokenizer, EpisodeSettings(env_name="guess_number"))
    arithmetic_row = PromptSample("What is 2 + 3?", references=["5"], fields={"answer": "5"})
    with pytest.raises(EnvFailedError) as caught:
        runner.run(ScriptedEngine(tokenizer, [], "<|im_end|>"), [arithmetic_row], SamplingSettings(n=1))
    message = str(caught.value)
    assert message.startswith("environment 'guess_number' failed in start(row) on row 0 of the batch (prompt 'What is 2 + 3?')")
    assert "plays rows with a 'target' column" in message and "this row's columns: prompt, answer" in message


def test_a_missing_column_is_a_key_error_naming_the_columns():
    from polyrl.envs import EpisodeRow

    row = EpisodeRow("p", fields={"a": 1})
    with pytest.raises(KeyError) as caught:
        row["target"]
    assert str(caught.value) == "the row has no 'target' column; its columns: prompt, a"
    assert row.get("target") is None


def test_step_raising_names_the_method_turn_row_and_line(tiny_arch_dir):
    with pytest.raises(EnvFailedError) as caught:
        play(tiny_arch_dir, FailingEnv)
    message = str(caught.value)
    assert message.startswith("environment 'my_env' raised KeyError: 'b' in step(text) on turn 1 of row id 'g-3'")
    assert "after the assistant wrote '7'" in message
    assert "test_env_failures.py, line " in message  # the environment's own line


def test_sys_exit_in_step_is_an_error_not_an_exit(tiny_arch_dir):
    with pytest.raises(EnvFailedError, match=r"environment 'my_env' called sys.exit\(0\) in step\(text\) on turn 1"):
        play(tiny_arch_dir, lambda: FailingEnv("exit"))


def test_a_step_that_never_returns_stops_the_run_within_its_budget(tiny_arch_dir):
    started = time.perf_counter()
    with pytest.raises(EnvStuckError) as caught:
        play(tiny_arch_dir, lambda: FailingEnv("hang"), step_timeout_s=0.3)
    assert time.perf_counter() - started < 10  # tokenizer load included; the hang is 30 s
    assert "environment 'my_env': step(text) did not return within 0.3 s" in str(caught.value)
    assert "raise env.step_timeout_s" in str(caught.value)


@pytest.mark.parametrize(
    ("reward", "text"),
    [
        (math.nan, "returned reward nan; rewards must be finite numbers or None"),
        (-math.inf, "returned reward -inf"),
        (1e39, "beyond the float32 range"),
        ("1.0", "returned reward '1.0' (str); expected a float or None"),
        (True, "returned reward True (bool)"),
        (torch.tensor([1.0, 2.0]), "(Tensor); expected a float or None"),
    ],
)
def test_bad_rewards_are_refused_naming_the_turn(tiny_arch_dir, reward, text):
    with pytest.raises(EnvFailedError) as caught:
        play(tiny_arch_dir, lambda: FailingEnv("reward", reward))
    assert "environment 'my_env': step(text) on turn 1 of row id 'g-3'" in str(caught.value)
    assert text in str(caught.value)


@pytest.mark.parametrize("reward", [np.float32(0.5), np.float64(0.5), np.array(0.5), torch.tensor(0.5), 1])
def test_numpy_and_torch_rewards_are_numbers(tiny_arch_dir, reward):
    ((episode,),) = play(tiny_arch_dir, lambda: FailingEnv("reward", reward))
    record = episode.episode
    assert record["return"] == pytest.approx(0.5 if reward != 1 else 1.0)
    assert type(record["turns"][-1]["reward"]) is float
    json.dumps(record)  # the sample table's JSON (np.float32 raised TypeError here before)


def test_checked_reward_rule():
    assert checked_reward(None, where="w") is None
    assert checked_reward(np.int64(3), where="w") == 3.0
    with pytest.raises(EnvFailedError, match="^w returned reward nan"):
        checked_reward(float("nan"), where="w")
