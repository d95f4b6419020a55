"""Experiment schema: arms, presets, --set overrides, and errors that name the field path."""

from __future__ import annotations

import pytest
import yaml

from polyrl.platform.config import ConfigError, flatten, load_experiment, parse_set_options, resolve_arms, to_yaml


def _write(tmp_path, text: str):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_arms_override_base_and_keep_the_rest(tmp_path):
    path = _write(tmp_path, """
name: demo
train: {steps: 7, learning_rate: 1.0e-4}
objective: {name: grpo}
arms:
  grpo: {}
  dr_grpo: {objective: {name: dr_grpo}}
  dapo_dotted: {objective.name: dapo, train.steps: 3}
""")
    arms = load_experiment(path)
    assert list(arms) == ["grpo", "dr_grpo", "dapo_dotted"]
    assert arms["grpo"].objective.name == "grpo"
    assert arms["dr_grpo"].objective.name == "dr_grpo"
    assert arms["dr_grpo"].train.steps == 7 and arms["dr_grpo"].train.learning_rate == 1e-4
    assert arms["dapo_dotted"].objective.name == "dapo" and arms["dapo_dotted"].train.steps == 3


def test_no_arms_gives_one_main_arm(tmp_path):
    arms = load_experiment(_write(tmp_path, "name: solo\n"))
    assert list(arms) == ["main"]
    assert arms["main"].rollout.engine == "vllm"  # the default engine


def test_set_options_win_over_arms_and_parse_yaml_scalars(tmp_path):
    path = _write(tmp_path, "name: demo\narms:\n  a: {train: {steps: 5}}\n")
    arms = load_experiment(path, set_options=["train.steps=2", "rollout.engine=hf", "tracking.progress=false"])
    assert arms["a"].train.steps == 2
    assert arms["a"].rollout.engine == "hf"
    assert arms["a"].tracking.progress is False
    assert parse_set_options(["a.b.c=1.5e-3"]) == {"a": {"b": {"c": 1.5e-3}}}
    with pytest.raises(ConfigError, match="KEY.PATH=VALUE"):
        parse_set_options(["train.steps"])


def test_preset_sets_the_seed_table_and_explicit_keys_win(tmp_path):
    path = _write(tmp_path, "name: p\npreset: 1b_10b\ntrain: {learning_rate: 3.0e-6}\n")
    config = load_experiment(path)["main"]
    # Seed 003 table, 1-10B row: batch 512, eps 0.15, gamma 0.95, lambda 0.95, lr 1e-6.
    assert config.objective.params == {"clip_low": 0.15, "clip_high": 0.15}
    assert config.modalities.text.gamma == 0.95 and config.modalities.text.lam == 0.95
    assert config.train.samples_per_update == 512
    assert config.train.learning_rate == 3e-6  # explicit key beats the preset


@pytest.mark.parametrize(
    "text, expected",
    [
        # Literal: names the path, the bad value and the allowed values.
        ("name: x\nrollout: {engine: tgi}\n", ["rollout.engine", "'tgi'", "'vllm'", "'hf'"]),
        # Bound: names the path, the value and the bound.
        ("name: x\nrollout: {samples_per_prompt: 0}\n", ["rollout.samples_per_prompt", "0", ">= 1"]),
        # Unknown key: names the path and lists the allowed keys of that section.
        ("name: x\ntrain: {stepz: 3}\n", ["train.stepz", "unknown field", "steps", "learning_rate"]),
        # Registry-backed names list what is registered.
        ("name: x\nobjective: {name: ppo2}\n", ["objective.name", "'ppo2'", "grpo", "dr_grpo", "bapo"]),
        ("name: x\nobjective: {name: grpo, aggregation: mean}\n", ["objective.aggregation", "token_mean", "seq_sum_constant_norm"]),
        ("name: x\nobjective: {name: grpo, params: {clip_hi: 0.3}}\n", ["objective.params", "clip_hi", "clip_high"]),
        ("name: x\nadvantage: {estimator: vtrace}\n", ["advantage.estimator", "gae", "group_norm", "rloo"]),
        ("name: x\nrewards: [{module: accuracy, wieght: 2}]\n", ["rewards[0].wieght", "unknown field"]),
        ("name: x\npreset: huge\n", ["preset", "'huge'", "lt_1b"]),
        ("name: 'a b'\n", ["name", "letters, digits"]),
        ("rollout: {}\n", ["name", "Field required"]),
    ],
)
def test_bad_files_name_the_field_path_value_and_allowed_values(tmp_path, text, expected):
    with pytest.raises(ConfigError) as caught:
        load_experiment(_write(tmp_path, text))
    message = str(caught.value)
    for fragment in expected:
        assert fragment in message, (fragment, message)
    assert "Traceback" not in message


def test_arm_errors_name_the_arm(tmp_path):
    path = _write(tmp_path, "name: x\narms:\n  fast: {train: {steps: -1}}\n")
    with pytest.raises(ConfigError, match=r"arm 'fast'.*\n.*train.steps"):
        load_experiment(path)


def test_yaml_is_loaded_safely(tmp_path):
    path = _write(tmp_path, "name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_experiment(path)


def test_resolved_config_round_trips_and_flattens(tmp_path):
    config = load_experiment(_write(tmp_path, "name: rt\nrewards: [{module: accuracy}, {module: length, weight: 0.1}]\n"))["main"]
    again = resolve_arms(yaml.safe_load(to_yaml(config)))["main"]
    assert again == config
    flat = flatten(config.model_dump(mode="json"))
    assert flat["objective.name"] == "grpo"
    assert flat["rewards.1.module"] == "length" and flat["rewards.1.weight"] == 0.1
    assert flat["modalities.image.gamma"] == 0.85 and flat["modalities.text.lam"] == 0.9


def test_shipped_experiments_validate():
    from pathlib import Path

    from polyrl.platform.runner import validate_file

    files = sorted(Path(__file__).resolve().parents[2].joinpath("experiments").glob("*.yaml"))
    assert files, "no shipped experiments"
    for path in files:
        assert validate_file(path), path
