"""``env:`` in the experiment YAML: what it accepts and what it refuses, by field path."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from polyrl.config.schema import ExperimentConfig


def config(**extra):
    return {"name": "e", "data": {"source": "calculator"}, "env": {"module": "calculator", "max_turns": 3}, **extra}


def test_env_accepted_with_its_defaults():
    cfg = ExperimentConfig.model_validate(config())
    assert (cfg.env.module, cfg.env.max_turns, cfg.env.max_episode_tokens, cfg.env.tool_format) == ("calculator", 3, 512, "auto")
    assert ExperimentConfig.model_validate({"name": "plain"}).env is None


def test_env_accepted_with_asynchronous_training():
    # Asynchronous training plays episodes (tests/envs/test_episode_async.py).
    assert ExperimentConfig.model_validate(config(rollout={"max_staleness": 1})).rollout.max_staleness == 1


@pytest.mark.parametrize(
    ("extra", "where", "text"),
    [
        ({"env": {"module": "nope"}}, "env", "unknown environment 'nope'"),
        ({"env": {"module": "calculator", "params": {"typo": 1}}}, "env", "bad params"),
        ({"env": {"module": "calculator", "max_turns": 0}}, "env.max_turns", "greater than or equal to 1"),
        ({"env": {"module": "calculator", "tool_format": "xml"}}, "env.tool_format", "auto"),
        ({"rewards": [{"module": "accuracy"}]}, "rewards", "the reward is the episode's return"),
        ({"advantage": {"overlong": {"mode": "soft_punishment"}}}, "advantage.overlong.mode", "one turn's budget"),
    ],
)
def test_refusals_name_the_field(extra, where, text):
    with pytest.raises(ValidationError) as caught:
        ExperimentConfig.model_validate(config(**extra))
    errors = caught.value.errors()
    assert any(".".join(str(p) for p in e["loc"]).startswith(where) and text in e["msg"] for e in errors), errors
