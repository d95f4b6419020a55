"""Experiment schema: arms, presets, --set overrides, and errors that name the field path."""

from __future__ import annotations

import pytest
import yaml

from polyrl.algos.objectives import get_objective
from polyrl.config.schema import (
    ConfigError,
    TrainConfig,
    flatten,
    load_experiment,
    parse_set_options,
    resolve_arms,
    to_yaml,
)
from polyrl.config.yaml_files import safe_load_unique
from polyrl.core.errors import PolyrlError


def _write(tmp_path, text: str):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_arms_override_base_and_keep_the_rest(tmp_path):
    path = _write(
        tmp_path,
        """
name: demo
train: {steps: 7, learning_rate: 1.0e-4}
objective: {name: grpo}
arms:
  grpo: {}
  dr_grpo: {objective: {name: dr_grpo}}
  dapo_dotted: {objective.name: dapo, train.steps: 3}
""",
    )
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
    # polyrl's own preset table (config presets), 1-10B row: batch 512, eps 0.15, gamma 0.95, lambda 0.95, lr 1e-6.
    assert config.objective.params == {"clip_low": 0.15, "clip_high": 0.15}
    # batch 512 samples / 8 samples per prompt (the schema default) = 64 prompts per step
    assert config.rollout.prompts_per_step == 64 and config.rollout.samples_per_prompt == 8
    assert config.train.learning_rate == 3e-6  # explicit key beats the preset
    # grpo's group_norm estimator uses no discount, so the preset leaves gamma/lambda alone
    assert (config.modalities.text.gamma, config.modalities.text.lam) == (0.95, 0.9)
    assert "samples_per_update" not in TrainConfig.model_fields


def test_preset_batch_shapes_the_rollout_from_the_resolved_samples_per_prompt(tmp_path):
    # lt_1b: batch 256; samples_per_prompt 16 from the YAML -> 256 / 16 = 16 prompts per step
    config = load_experiment(_write(tmp_path, "name: p\npreset: lt_1b\nrollout: {samples_per_prompt: 16}\n"))["main"]
    assert (config.rollout.prompts_per_step, config.rollout.samples_per_prompt) == (16, 16)
    # an explicit prompts_per_step wins
    config = load_experiment(_write(tmp_path, "name: p\npreset: lt_1b\nrollout: {prompts_per_step: 3}\n"))["main"]
    assert config.rollout.prompts_per_step == 3
    # a batch the samples per prompt do not divide (256 / 6) is refused, not rounded
    with pytest.raises(ConfigError, match=r"preset: .*256.*samples_per_prompt 6 does not divide"):
        load_experiment(_write(tmp_path, "name: p\npreset: lt_1b\nrollout: {samples_per_prompt: 6}\n"))
    with pytest.raises(ConfigError, match="train.samples_per_update.*unknown field"):
        load_experiment(_write(tmp_path, "name: p\ntrain: {samples_per_update: 256}\n"))


@pytest.mark.parametrize(
    "objective, expected",
    [
        ("ppo", {"clip_low": 0.1, "clip_high": 0.1}),
        ("grpo", {"clip_low": 0.1, "clip_high": 0.1}),
        ("dr_grpo", {"clip_low": 0.1, "clip_high": 0.1}),
        # DAPO keeps its clip-higher gap of 0.08 (paper 0.2 / 0.28): 0.1 / 0.18
        ("dapo", {"clip_low": 0.1, "clip_high": 0.1 + 0.08}),
        # sequence-ratio widths and searched bounds keep their own scale
        ("gspo", {}),
        ("gspo_token", {}),
        ("bapo", {}),
    ],
)
def test_presets_are_objective_aware(tmp_path, objective, expected):
    config = load_experiment(_write(tmp_path, f"name: p\npreset: gt_10b\nobjective: {{name: {objective}}}\n"))["main"]
    assert config.objective.params == pytest.approx(expected, abs=1e-15)
    spec = get_objective(objective)
    effective = {**spec.default_params, **config.objective.params}
    if objective.startswith("gspo"):
        assert (effective["clip_low"], effective["clip_high"]) == (3e-4, 4e-4)


def test_preset_explicit_objective_params_win_and_gae_gets_the_discounts(tmp_path):
    text = "name: p\npreset: gt_10b\nobjective: {name: dapo, params: {clip_high: 0.3}}\n"
    assert load_experiment(_write(tmp_path, text))["main"].objective.params == {"clip_low": 0.1, "clip_high": 0.3}
    # ppo's default estimator is GAE, which reads the text modality's gamma/lambda: 0.9 / 0.8
    config = load_experiment(_write(tmp_path, "name: p\npreset: gt_10b\nobjective: {name: ppo}\n"))["main"]
    assert (config.modalities.text.gamma, config.modalities.text.lam) == (0.9, 0.8)
    config = load_experiment(_write(tmp_path, "name: p\npreset: gt_10b\nadvantage: {estimator: gae}\n"))["main"]
    assert (config.modalities.text.gamma, config.modalities.text.lam) == (0.9, 0.8)
    # BAPO with a preset no longer fails on keys the user never wrote
    config = load_experiment(_write(tmp_path, "name: p\npreset: lt_1b\nobjective: {name: bapo}\n"))["main"]
    assert config.objective.params == {} and config.train.learning_rate == 5e-6


@pytest.mark.parametrize(
    "text, expected",
    [
        # Literal: names the path, the bad value and the allowed values.
        ("name: x\nrollout: {engine: tgi}\n", ["rollout.engine", "'tgi'", "'vllm'", "'hf'"]),
        # Bound: names the path, the value and the bound.
        ("name: x\nrollout: {samples_per_prompt: 0}\n", ["rollout.samples_per_prompt", "0", ">= 1"]),
        # A device name: the path, the value and the forms allowed.
        ("name: x\ntrain: {device: gpu}\n", ["train.device", "'gpu'", "'auto'", "'cpu'", "'cuda:N'"]),
        # Unknown key: names the path and lists the allowed keys of that section.
        ("name: x\ntrain: {stepz: 3}\n", ["train.stepz", "unknown field", "steps", "learning_rate"]),
        # Registry-backed names list what is registered.
        ("name: x\nobjective: {name: ppo2}\n", ["objective.name", "'ppo2'", "grpo", "dr_grpo", "bapo"]),
        (
            "name: x\nobjective: {name: grpo, aggregation: mean}\n",
            ["objective.aggregation", "token_mean", "seq_sum_constant_norm"],
        ),
        (
            "name: x\nobjective: {name: grpo, params: {clip_hi: 0.3}}\n",
            ["objective.params.clip_hi", "unknown parameter", "clip_high"],
        ),
        # Typed objective params: strict types and ranges, with the field path and what is allowed.
        (
            "name: x\nobjective: {name: grpo, params: {clip_low: '0.2'}}\n",
            ["objective.params.clip_low", "'0.2'", "allowed: number >= 0 and < 1"],
        ),
        (
            "name: x\nobjective: {name: ppo, params: {dual_clip: 0.5}}\n",
            ["objective.params.dual_clip", "0.5", "allowed: number > 1, or null"],
        ),
        (
            "name: x\nobjective: {name: dapo, params: {clip_high: -0.1}}\n",
            ["objective.params.clip_high", "-0.1", "allowed: number >= 0"],
        ),
        ("name: x\nobjective: {name: gspo, params: {clip_low: .nan}}\n", ["objective.params.clip_low", "finite"]),
        (
            "name: x\nobjective: {name: bapo, params: {c_high_start: 0.9}}\n",
            ["objective.params.c_high_start", "allowed: number > 1"],
        ),
        (
            "name: x\nobjective: {name: bapo, params: {bound_search: 1}}\n",
            ["objective.params.bound_search", "allowed: true or false"],
        ),
        (
            "name: x\nobjective: {name: bapo, params: {c_low_start: 0.8, c_low_max: 0.7}}\n",
            ["objective.params", "c_low_start <= c_low_max"],
        ),
        (
            "name: x\nobjective: {name: bapo, params: {positive_weight_beta: 7}}\n",
            ["objective.params", "positive_weight_beta", "positive_weight_sigmoid on"],
        ),
        # One home per setting: the train.* spelling is the only one.
        (
            "name: x\nobjective: {name: grpo, params: {kl_coef: 0.04}}\n",
            ["objective.params.kl_coef", "set train.kl_coef instead"],
        ),
        (
            "name: x\nobjective: {name: dapo, params: {kl_estimator: k1}}\n",
            ["objective.params.kl_estimator", "train.kl_estimator"],
        ),
        (
            "name: x\nobjective: {name: bapo, params: {entropy_coef: 0.01}}\n",
            ["objective.params.entropy_coef", "train.entropy_coef"],
        ),
        # Typed advantage params, checked against the estimator that will run (the objective's default here).
        ("name: x\nadvantage: {params: {std_scale: global}}\n", ["advantage.params.std_scale", "'global'", "'group' or 'batch'"]),
        ("name: x\nadvantage: {params: {eps: 0}}\n", ["advantage.params.eps", "allowed: number > 0"]),
        (
            "name: x\nadvantage: {estimator: rloo, params: {eps: 1.0e-6}}\n",
            ["advantage.params.eps", "unknown parameter", "(none)"],
        ),
        ("name: x\nobjective: {name: ppo}\nadvantage: {params: {whiten: 'yes'}}\n", ["advantage.params.whiten", "true or false"]),
        # Every float of the schema is finite.
        ("name: x\ntrain: {learning_rate: .inf}\n", ["train.learning_rate", "finite number", "inf"]),
        ("name: x\nhealth: {min_entropy: .nan}\n", ["health.min_entropy", "finite number"]),
        ("name: x\nadvantage: {estimator: vtrace}\n", ["advantage.estimator", "gae", "group_norm", "rloo"]),
        ("name: x\nrewards: [{module: accuracy, wieght: 2}]\n", ["rewards[0].wieght", "unknown field"]),
        ("name: x\npreset: huge\n", ["preset", "'huge'", "lt_1b"]),
        ("name: 'a b'\n", ["name", "letters, digits"]),
        ("name: '..'\n", ["name", "not be '.' or '..'"]),
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

    from polyrl.launch.runner import validate_file

    # The top level and the claim re-tests (repro/: tiny policy, real/: SmolLM2); evals/ and
    # snippets/ hold other kinds of files.
    root = Path(__file__).resolve().parents[2].joinpath("experiments")
    files = sorted([*root.glob("*.yaml"), *root.glob("repro/*.yaml"), *root.glob("real/*.yaml")])
    assert files, "no shipped experiments"
    assert {"clip_bounds.yaml", "grpo_vs_drgrpo.yaml"} <= {path.name for path in root.glob("real/*.yaml")}
    for path in files:
        assert validate_file(path), path


def test_typed_params_come_out_as_python_values(tmp_path):
    text = "name: x\nobjective: {name: ppo, params: {clip_low: 0, dual_clip: 3}}\nadvantage: {estimator: group_norm, params: {use_std: false}}\n"
    config = load_experiment(_write(tmp_path, text))["main"]
    # ints given for float params become floats; only the keys the user wrote are stored
    assert config.objective.params == {"clip_low": 0.0, "dual_clip": 3.0}
    assert all(type(value) is float for value in config.objective.params.values())
    assert config.advantage.params == {"use_std": False}


def test_duplicate_keys_are_refused_naming_the_key_and_both_lines(tmp_path):
    text = "name: x\ntrain:\n  steps: 50\nrollout: {engine: hf}\ntrain:\n  steps: 2\n"
    with pytest.raises(ConfigError) as caught:
        load_experiment(_write(tmp_path, text))
    assert "duplicate key 'train' at line 5 (first at line 2)" in str(caught.value)
    assert str(tmp_path / "exp.yaml") in str(caught.value)
    # nested mappings too, and the function is reusable on any text
    with pytest.raises(PolyrlError, match=r"suite.yaml: duplicate key 'steps' at line 3 \(first at line 2\)"):
        safe_load_unique("train:\n  steps: 1\n  steps: 2\n", "suite.yaml")
    # merge keys may still be overridden, as YAML intends
    assert safe_load_unique("base: &b {k: 1}\nd:\n  <<: *b\n  k: 2\n", "x") == {"base": {"k": 1}, "d": {"k": 2}}


@pytest.mark.parametrize("arm", ["../../x", "/abs/x", "a b", "..", "x/y"])
def test_arm_names_that_would_escape_their_folder_are_refused(tmp_path, arm):
    path = _write(tmp_path, yaml.safe_dump({"name": "x", "arms": {arm: {}, "ok": {}}}))
    with pytest.raises(ConfigError) as caught:
        load_experiment(path)
    assert f"arms.{arm}" in str(caught.value) and "letters, digits" in str(caught.value)


def test_polyrl_validate_refuses_bad_typed_params_and_duplicate_keys(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    polyrl = Path(sys.executable).with_name("polyrl")
    bad = _write(tmp_path, "name: x\nobjective: {name: ppo, params: {clip_low: '0.2', dual_clip: 0.5, kl_coef: 0.1}}\n")
    result = subprocess.run([str(polyrl), "validate", str(bad)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    for fragment in ("objective.params.clip_low", "allowed: number >= 0 and < 1", "objective.params.dual_clip",
                     "allowed: number > 1, or null", "objective.params.kl_coef", "set train.kl_coef instead"):  # fmt: skip
        assert fragment in result.stderr, (fragment, result.stderr)
    assert "Traceback" not in result.stderr
    duplicate = tmp_path / "dup.yaml"
    duplicate.write_text("name: x\ntrain: {steps: 3}\ntrain: {steps: 4}\n")
    result = subprocess.run([str(polyrl), "validate", str(duplicate)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "duplicate key 'train' at line 3 (first at line 2)" in result.stderr
    assert "Traceback" not in result.stderr


def test_kv_cache_is_sized_to_the_run_unless_given_in_gib():
    from pydantic import ValidationError

    from polyrl.config.rollout import RolloutConfig

    assert RolloutConfig().kv_cache_gb == "auto"
    assert RolloutConfig(kv_cache_gb=0.5).kv_cache_gb == 0.5
    for bad in (0, -1.0, "big"):
        with pytest.raises(ValidationError, match="kv_cache_gb"):
            RolloutConfig(kv_cache_gb=bad)
