"""A setting written where it would do nothing is refused, naming its field path, why and what is
allowed (every accepted setting does something or is refused; docs/bad-input.md). Before, each of these
loaded, trained, and was recorded in MLflow as if it had acted."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from polyrl.cli.main import app
from polyrl.config.schema import ConfigError, resolve_arms, to_yaml

REFUSED = [
    (
        {"model": {"path": "/models/m", "builtin": {"size": "3m"}}},
        "model.builtin: set, but model.path '/models/m' is the policy, so no built-in one is built",
        "allowed here: model.path or model.builtin, not both",
    ),
    (
        {"model": {"path": "/models/m", "cache_dir": "/tmp/cache"}},
        "model.cache_dir: set, but model.path '/models/m' is a model folder, used where it is",
        "allowed here: no cache_dir (got '/tmp/cache')",
    ),
    (
        {"train": {"kl_in_reward": True}},
        "train.kl_in_reward: set, but train.kl_coef is 0, so there is no KL to put in the reward",
        "allowed here: kl_coef > 0, or kl_in_reward: false",
    ),
    (
        {"train": {"kl_in_reward": True, "kl_coef": 0.0}},
        "train.kl_in_reward: set, but train.kl_coef is 0",
        "(got True)",
    ),
    ({"train": {"kl_estimator": "k1"}}, "train.kl_estimator: set, but train.kl_coef is 0", "(got 'k1')"),
    ({"train": {"min_lr_ratio": 0.1}}, "train.min_lr_ratio: set, but train.lr_schedule is 'constant'", "linear or cosine"),
    (
        {"rollout": {"engine": "hf", "kv_cache_gb": 0.25}},
        "rollout.kv_cache_gb: set, but rollout.engine is 'hf', which keeps no vLLM KV cache to size",
        "allowed here: engine: vllm, or kv_cache_gb: auto (or unset) (got 0.25)",
    ),
    (
        {"train": {"value": {"learning_rate": 1e-3}}},
        "train.value: set, but the advantage estimator group_norm (objective grpo's) uses no critic",
        "advantage.estimator: gae",
    ),
    (
        {"advantage": {"overlong": {"cache_length": 8}}},
        "advantage.overlong.cache_length: set, but advantage.overlong.mode is 'off'",
        "allowed here: mode: soft_punishment, or no cache_length (got 8)",
    ),
    (
        {"advantage": {"overlong": {"mode": "mask_truncated", "max_length": 32}}},
        "advantage.overlong.max_length: set, but advantage.overlong.mode is 'mask_truncated'",
        "or no max_length",
    ),
    (
        {"advantage": {"overlong": {"penalty_weight": 0.5}}},
        "advantage.overlong.penalty_weight: set, but advantage.overlong.mode is 'off'",
        "or no penalty_weight",
    ),
    (
        {"advantage": {"dynamic_sampling": {"max_rounds": 5}}},
        "advantage.dynamic_sampling.max_rounds: set, but advantage.dynamic_sampling.enabled is false",
        "allowed here: enabled: true, or no max_rounds (got 5)",
    ),
    (
        {"rollout": {"truncated_importance_sampling": {"cap": 3.0}}},
        "rollout.truncated_importance_sampling.cap: set, but rollout.truncated_importance_sampling.enabled is false",
        "allowed here: enabled: true, or no cap (got 3.0)",
    ),
    (
        {"objective": {"rollout_correction": {"is_threshold": 3.0}}},
        "objective.rollout_correction.is_threshold: set, but objective.rollout_correction.is_level is null",
        "is_level: token or sequence",
    ),
    (
        {"modalities": {"text": {"gamma": 0.9, "lam": 0.9}}},
        "modalities: set, but the advantage estimator group_norm (objective grpo's) takes no per-token discounts",
        "advantage.estimator: gae",
    ),
    (
        {"eval": {"suite": "experiments/evals/arithmetic.yaml"}},
        "eval.suite: set, but eval.every is 0 (never), so no evaluation runs in training",
        "allowed here: every > 0, or no suite",
    ),
    ({"eval": {"every": 0, "limit": 10}}, "eval.limit: set, but eval.every is 0 (never)", "or no limit (got 10)"),
    (
        {"eval": {"every": 5}},
        "eval.every: set, but eval.suite is not set, so every 5 steps nothing is evaluated",
        "or every: 0 (got 5)",
    ),
    (
        {"health": {"held_out_metric": "eval/arithmetic/accuracy"}},
        "health.held_out_metric: set, but it is checked against periodic evaluation, which this run does not do",
        "eval.every > 0 with eval.suite",
    ),
]


@pytest.mark.parametrize("overrides, where, allowed", REFUSED, ids=[where.split(":")[0] for _, where, _ in REFUSED])
def test_a_setting_that_would_do_nothing_is_refused_naming_its_field(overrides, where, allowed):
    with pytest.raises(ConfigError) as refused:
        resolve_arms({"name": "x", **overrides})
    message = str(refused.value)
    assert where in message and allowed in message, message
    assert message.count("\n  - ") == 1, message  # one problem, one line


ACCEPTED = [
    {"model": {"path": "/models/m.gguf", "cache_dir": "/tmp/cache"}},
    {"model": {"builtin": {"size": "3m"}, "cache_dir": "/tmp/cache"}},
    {"train": {"kl_in_reward": True, "kl_coef": 0.01, "kl_estimator": "k1"}},
    {"train": {"kl_in_reward": False, "kl_coef": 0.0}},  # false never acts: writing it is harmless
    {"train": {"lr_schedule": "cosine", "min_lr_ratio": 0.1}},
    {
        "objective": {"name": "ppo"},
        "train": {"value": {"learning_rate": 1e-3}},
        "modalities": {"text": {"gamma": 0.9, "lam": 0.9}},
    },
    {"advantage": {"overlong": {"mode": "soft_punishment", "max_length": 32, "cache_length": 8, "penalty_weight": 0.5}}},
    {"advantage": {"dynamic_sampling": {"enabled": True, "max_rounds": 5}}},
    {"rollout": {"truncated_importance_sampling": {"enabled": True, "cap": 3.0}}},
    {"rollout": {"engine": "vllm", "kv_cache_gb": 0.25}},
    {"rollout": {"kv_cache_gb": 0.25}},  # the default engine is vLLM
    {"rollout": {"engine": "hf", "kv_cache_gb": "auto"}},  # auto never sizes anything by itself
    {"objective": {"rollout_correction": {"is_level": "token", "is_threshold": 3.0}}},
    {"eval": {"every": 0}},
    {
        "eval": {"every": 5, "suite": "experiments/evals/arithmetic.yaml", "limit": 10},
        "health": {"held_out_metric": "eval/a/accuracy"},
    },
]


@pytest.mark.parametrize("overrides", ACCEPTED)
def test_the_same_settings_are_accepted_where_they_act(overrides):
    resolve_arms({"name": "x", **overrides})


def test_reinforce_pp_with_kl_coef_0_turns_the_presets_kl_off_rather_than_being_refused():
    # The preset's kl_in_reward and kl_estimator are not the user's: kl_coef: 0 drops them.
    config = resolve_arms({"name": "x", "objective": {"name": "reinforce_pp"}, "train": {"kl_coef": 0}})["main"]
    assert (config.train.kl_in_reward, config.train.kl_estimator) == (False, "k3")
    # Written by the user, they are refused as anywhere else.
    with pytest.raises(ConfigError, match=r"train\.kl_in_reward: set, but train\.kl_coef is 0"):
        resolve_arms({"name": "x", "objective": {"name": "reinforce_pp"}, "train": {"kl_coef": 0, "kl_in_reward": True}})


def test_an_arm_or_set_that_turns_a_feature_off_keeps_the_bases_settings_of_it():
    # Ablations: the base's settings act in the arms where the feature is on.
    raw = {
        "name": "x",
        "objective": {"name": "ppo"},
        "train": {"value": {"learning_rate": 1e-3}},
        "modalities": {"text": {"gamma": 0.9, "lam": 0.9}},
        "advantage": {"dynamic_sampling": {"enabled": True, "max_rounds": 5}},
        "eval": {"every": 5, "suite": "arithmetic"},
        "arms": {"on": {}, "no_ds": {"advantage.dynamic_sampling.enabled": False}, "grpo": {"objective.name": "grpo"}},
    }
    arms = resolve_arms(raw, overrides={"eval": {"every": 0}})  # --set eval.every=0
    assert arms["no_ds"].advantage.dynamic_sampling.max_rounds == 5 and arms["grpo"].eval.every == 0


def test_an_arm_that_writes_a_setting_its_own_switch_leaves_off_is_refused_naming_the_arm():
    raw = {"name": "x", "arms": {"on": {}, "off": {"advantage.dynamic_sampling.max_rounds": 5}}}
    with pytest.raises(ConfigError, match=r"\(arm 'off'\).*\n  - advantage\.dynamic_sampling\.max_rounds: set"):
        resolve_arms(raw)
    # Switch and field in one layer (here both from --set): refused too.
    with pytest.raises(ConfigError, match=r"eval\.suite: set, but eval\.every is 0"):
        resolve_arms({"name": "x"}, overrides={"eval": {"every": 0, "suite": "arithmetic"}})


ROUND_TRIPS = [
    {},
    {"objective": {"name": "ppo"}, "train": {"kl_coef": 0.05, "kl_in_reward": True}},
    {"advantage": {"overlong": {"mode": "soft_punishment", "cache_length": 4}}},
    {"eval": {"every": 2, "suite": "experiments/evals/arithmetic.yaml"}},
    # Refused before by their own sections when written, yet written by every full dump, so a
    # dumped config did not load again (a Ray arm, ray_workers.py, re-reads one):
    {"objective": {"rollout_correction": {"mis": {"low": 0.5, "high": 2.0}}}},
    {"model": {"builtin": {"name": "smollm2-135m-instruct"}}},
    {"env": {"module": "calculator"}, "data": {"source": "calculator"}},
]


@pytest.mark.parametrize("overrides", ROUND_TRIPS)
def test_a_resolved_config_dumped_to_yaml_loads_again_as_the_same_config(overrides):
    config = resolve_arms({"name": "x", **overrides})["main"]
    dumped = yaml.safe_load(to_yaml(config))
    assert resolve_arms(dumped)["main"] == config


def test_polyrl_validate_refuses_an_idle_setting(tmp_path, monkeypatch):
    path = tmp_path / "exp.yaml"
    path.write_text("name: x\nadvantage:\n  dynamic_sampling: {max_rounds: 5}\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate", str(path)])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output  # before: "ok", exit 0
    assert "advantage.dynamic_sampling.max_rounds: set, but advantage.dynamic_sampling.enabled is false" in output
