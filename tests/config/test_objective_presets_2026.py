"""The 2025-26 objectives from the YAML: selectable by name with their paper defaults, typed params
refused by field path, objective presets (REINFORCE++'s KL in the reward) under explicit keys,
and the size presets' clip only where the objective's ratio is on PPO's scale."""

from __future__ import annotations

import pytest

from polyrl.algos.advantages import get_advantage
from polyrl.algos.objectives import get_objective
from polyrl.config.presets import OBJECTIVE_PRESETS
from polyrl.config.schema import ConfigError, load_experiment

NEW = ["cispo", "gpg", "sapo", "gmpo", "clip_cov", "kl_cov", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax"]


def _load(tmp_path, text: str, arm: str = "main"):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return load_experiment(path)[arm]


@pytest.mark.parametrize("name", NEW)
def test_each_new_objective_is_selectable_with_its_defaults(tmp_path, name):
    config = _load(tmp_path, f"name: p\nobjective: {{name: {name}}}\n")
    spec = get_objective(name)
    assert config.objective.name == name and config.objective.params == {}
    assert get_advantage(config.advantage.estimator or spec.default_advantage).name == spec.default_advantage


def test_arms_compare_new_objectives_with_their_params(tmp_path):
    text = (
        "name: p\narms:\n"
        "  cispo: {objective: {name: cispo, params: {clip_high: 1.0}}}\n"
        "  sapo: {objective: {name: sapo, params: {temperature_neg: 2.0}}}\n"
        "  kl_cov: {objective: {name: kl_cov, params: {kl_cov_ratio: 0.01}}}\n"
    )
    assert _load(tmp_path, text, "cispo").objective.params == {"clip_high": 1.0}
    assert _load(tmp_path, text, "sapo").objective.params == {"temperature_neg": 2.0}
    assert _load(tmp_path, text, "kl_cov").objective.params == {"kl_cov_ratio": 0.01}


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("objective: {name: sapo, params: {temperature_pos: 0}}", ["objective.params.temperature_pos", "> 0"]),
        ("objective: {name: cispo, params: {clip_high: '4'}}", ["objective.params.clip_high"]),
        ("objective: {name: clip_cov, params: {clip_cov_lb: 5, clip_cov_ub: 1}}", ["clip_cov_lb", "below clip_cov_ub"]),
        ("objective: {name: gmpo, params: {clip: 0.4}}", ["objective.params.clip", "clip_high", "clip_low"]),
        ("objective: {name: gpg}\nadvantage: {params: {std_normalize: 1}}", ["advantage.params.std_normalize"]),
    ],
)
def test_bad_params_are_refused_naming_the_field(tmp_path, text, fragments):
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, f"name: p\n{text}\n")
    for fragment in fragments:
        assert fragment in str(error.value)


def test_reinforce_pp_preset_puts_the_k1_kl_in_the_reward(tmp_path):
    config = _load(tmp_path, "name: p\nobjective: {name: reinforce_pp}\n")
    assert (config.train.kl_in_reward, config.train.kl_estimator, config.train.kl_coef) == (True, "k1", 0.01)
    assert OBJECTIVE_PRESETS["reinforce_pp"]["train"]["kl_coef"] == 0.01


def test_explicit_keys_beat_the_objective_preset_and_other_objectives_get_none(tmp_path):
    config = _load(tmp_path, "name: p\nobjective: {name: reinforce_pp}\ntrain: {kl_coef: 0.0}\n")
    # kl_coef: 0 turns the preset's KL off whole: its kl_in_reward and kl_estimator would do nothing.
    assert config.train.kl_coef == 0.0 and not config.train.kl_in_reward and config.train.kl_estimator == "k3"
    # An arm switching to REINFORCE++ gets the preset; the base arm (GRPO) does not.
    text = "name: p\narms:\n  base: {}\n  rpp: {objective: {name: reinforce_pp}}\n"
    assert not _load(tmp_path, text, "base").train.kl_in_reward
    assert _load(tmp_path, text, "rpp").train.kl_in_reward
    for name in NEW:
        if name != "reinforce_pp":
            assert _load(tmp_path, f"name: p\nobjective: {{name: {name}}}\n").train.kl_coef == 0.0


@pytest.mark.parametrize(
    ("objective", "expected"),
    [
        # PPO-clip surrogates take the preset's epsilon (gt_10b: 0.1) on both sides
        ("rloo", {"clip_low": 0.1, "clip_high": 0.1}),
        ("reinforce_pp", {"clip_low": 0.1, "clip_high": 0.1}),
        ("reinforce_pp_baseline", {"clip_low": 0.1, "clip_high": 0.1}),
        ("remax", {"clip_low": 0.1, "clip_high": 0.1}),
        ("clip_cov", {"clip_low": 0.1, "clip_high": 0.1}),
        # bounded on other scales: the preset leaves them alone
        ("cispo", {}),
        ("sapo", {}),
        ("gmpo", {}),
        ("kl_cov", {}),
        ("gpg", {}),
    ],
)
def test_size_presets_clip_only_ppo_scale_ratios(tmp_path, objective, expected):
    config = _load(tmp_path, f"name: p\npreset: gt_10b\nobjective: {{name: {objective}}}\n")
    assert config.objective.params == pytest.approx(expected, abs=1e-15)
