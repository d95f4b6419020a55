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
        # ReMax's baseline is a greedy completion's reward: episodes have none (before: accepted, failed after step 1).
        ({"objective": {"name": "remax"}}, "objective.name", "'remax' advantage estimator (the default of objective 'remax')"),
        ({"advantage": {"estimator": "remax"}}, "advantage.estimator", "which env: episodes do not have"),
        # An empty stop string ends every turn after one token (before: accepted).
        ({"env": {"module": "calculator", "stop": ["</tool_call>", ""]}}, "env.stop", "empty stop string"),
        # An episode budget below one turn's cuts even the first turn (before: 1-token episodes trained).
        ({"env": {"module": "calculator", "max_episode_tokens": 1}}, "env.max_episode_tokens", "below rollout.max_tokens (64)"),
        (
            {"env": {"module": "calculator", "max_episode_tokens": 96}, "rollout": {"max_tokens": 128}},
            "env.max_episode_tokens",
            "allowed: at least rollout.max_tokens",
        ),
        ({"env": {"module": "calculator", "step_timeout_s": 2}}, "env", "env.step_timeout_s (2) is below env.tool_timeout_s (5)"),
        ({"env": {"module": "calculator", "tool_parser": "xml"}}, "env.tool_parser", "'auto', 'hermes' or 'llama3_json'"),
    ],
)
def test_refusals_name_the_field(extra, where, text):
    with pytest.raises(ValidationError) as caught:
        ExperimentConfig.model_validate(config(**extra))
    errors = caught.value.errors()
    assert any(".".join(str(p) for p in e["loc"]).startswith(where) and text in e["msg"] for e in errors), errors


def test_the_episode_settings_reach_the_runner():
    cfg = ExperimentConfig.model_validate(config(env={"module": "calculator", "tool_parser": "llama3_json", "step_timeout_s": 9}))
    assert (cfg.env.tool_parser, cfg.env.step_timeout_s) == ("llama3_json", 9.0)
    from polyrl.trainer.build_rollout import build_episodes

    class Tokenizer:  # the runner's renderer needs only a template that renders no tools=
        chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kwargs):
            return "".join(m["content"] for m in messages)

    runner = build_episodes(cfg, Tokenizer())
    assert (runner.settings.tool_parser, runner.settings.step_timeout_s) == ("llama3_json", 9.0)
    assert runner.renderer.tool_parser == "llama3_json"  # the text protocol asks for llama3_json calls


def test_dr_grpo_constant_is_the_episode_budget():
    """Dr.GRPO divides each sample's token-loss sum by a constant, the most policy tokens a sample can hold:
    one completion's rollout.max_tokens (64 here), but an episode holds up to env.max_episode_tokens (384)
    over its turns (before: 64 with env: too, so long episodes weighed up to 6x more than intended)."""
    from polyrl.algos.objectives import get_objective
    from polyrl.trainer.build_models import learner_settings

    objective = get_objective("dr_grpo")
    with_env = ExperimentConfig.model_validate(
        config(env={"module": "calculator", "max_episode_tokens": 384}, objective={"name": "dr_grpo"})
    )
    assert learner_settings(with_env, objective).max_tokens == 384
    plain = ExperimentConfig.model_validate({"name": "p", "objective": {"name": "dr_grpo"}})
    assert learner_settings(plain, objective).max_tokens == 64
