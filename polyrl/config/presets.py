"""Hyper-parameter presets by model size, applied objective-aware. The table is polyrl's own starting
points (from its design notes), not a published recipe.

| preset | model size | batch | eps  | gamma | lambda | lr   |
|--------|------------|-------|------|-------|--------|------|
| lt_1b  | < 1B       | 256   | 0.2  | 0.99  | 0.9    | 5e-6 |
| 1b_10b | 1-10B      | 512   | 0.15 | 0.95  | 0.95   | 1e-6 |
| gt_10b | > 10B      | 1024  | 0.1  | 0.9   | 0.8    | 5e-7 |

Every value a preset sets does something; keys written in the YAML always win:

- ``batch`` is the rollout batch, samples per step: ``rollout.prompts_per_step = batch //
  samples_per_prompt`` (the resolved ``samples_per_prompt``; a batch it does not divide is
  refused). TRL's GRPOConfig counts its batch in completions the same way and likewise
  refuses a batch that ``num_generations`` does not divide.
- ``eps`` goes through the objective's registered ``preset_clip`` (PPO/GRPO/Dr.GRPO: both clip
  widths; DAPO: keeps its clip-higher gap). Objectives without one (GSPO's sequence-ratio widths
  ~1e-4, BAPO's searched bounds) keep their own clip scale: the preset sets no clip there.
- ``gamma`` / ``lam`` set the text modality's GAE discount, only when the advantage estimator
  uses per-token discounts (GAE); group estimators ignore them, so they are not set.
- ``lr`` sets ``train.learning_rate``.

Objective presets (:data:`OBJECTIVE_PRESETS`) are the other kind: the settings outside
``objective.params`` that an objective's paper pairs with it, applied whenever ``objective.name``
names it (with or without a size preset), again under the YAML's own keys. Everything else an
objective's paper fixes is in its registration: its typed params' defaults, its default
advantage estimator and aggregation (``polyrl objectives show NAME``), so ``objective: {name:
cispo}`` alone is CISPO as published. Only REINFORCE++ needs more: its token-level k1 KL in the
reward. The objectives whose ratio is bounded on another scale take no clip from a size preset
(CISPO's IS-weight cap, SAPO's gate, GMPO's log-space range, KL-Cov's unclipped ratio, GPG's
ratio-free loss); RLOO, REINFORCE++(-baseline), ReMax and Clip-Cov take it as PPO does.
"""

from __future__ import annotations

from typing import Any

from polyrl.config.objective import ObjectiveConfig
from polyrl.config.rollout import RolloutConfig
from polyrl.core.errors import PolyrlError

PRESETS: dict[str, dict[str, Any]] = {
    "lt_1b": {"batch": 256, "clip": 0.2, "gamma": 0.99, "lam": 0.9, "learning_rate": 5e-6},
    "1b_10b": {"batch": 512, "clip": 0.15, "gamma": 0.95, "lam": 0.95, "learning_rate": 1e-6},
    "gt_10b": {"batch": 1024, "clip": 0.1, "gamma": 0.9, "lam": 0.8, "learning_rate": 5e-7},
}


# objective name -> the config keys its paper pairs with it (merged under the YAML's keys).
OBJECTIVE_PRESETS: dict[str, dict[str, Any]] = {
    # REINFORCE++ (Hu et al., arXiv 2501.03262): r_t = R 1[t = last] - beta * (log pi_old - log pi_ref),
    # k1 per token, in the reward; beta 0.01 as in the authors' OpenRLHF recipes. A reference
    # model is loaded (train.kl_coef > 0); set train.kl_coef: 0 for REINFORCE++ without KL.
    "reinforce_pp": {"train": {"kl_in_reward": True, "kl_estimator": "k1", "kl_coef": 0.01}},
}


class PresetError(PolyrlError, ValueError):
    """A preset that cannot apply to this config."""


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    section = config.get(name)
    return section if isinstance(section, dict) else {}


def objective_preset_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """The config keys the objective preset of the raw ``config``'s ``objective.name`` sets
    (empty for an objective without one); merge them UNDER the config, so explicit keys win."""
    import copy

    name = _section(config, "objective").get("name", ObjectiveConfig.model_fields["name"].default)
    overrides = copy.deepcopy(OBJECTIVE_PRESETS.get(name, {})) if isinstance(name, str) else {}
    if _section(config, "train").get("kl_coef") == 0 and "train" in overrides:
        # kl_coef: 0 written in the YAML turns the preset's KL off (REINFORCE++ without KL): its
        # KL settings would do nothing, and are refused when written (polyrl/config/inert_settings.py).
        overrides["train"] = {key: value for key, value in overrides["train"].items() if not key.startswith("kl_")}
    return overrides


def preset_overrides(preset: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config keys ``preset`` sets for the raw (not yet validated) ``config`` it applies to;
    merge them UNDER the config, so explicit keys win. Values the config holds that are invalid
    are left for the schema to report."""
    from polyrl.algos.advantages import get_advantage, list_advantages
    from polyrl.algos.objectives import get_objective, list_objectives

    config = config or {}
    values = PRESETS[preset]
    overrides: dict[str, Any] = {"train": {"learning_rate": values["learning_rate"]}}

    rollout = _section(config, "rollout")
    samples = rollout.get("samples_per_prompt", RolloutConfig.model_fields["samples_per_prompt"].default)
    if "prompts_per_step" not in rollout and type(samples) is int and samples >= 1:
        if values["batch"] % samples:
            raise PresetError(
                f"preset {preset!r} sets a batch of {values['batch']} samples per step, which "
                f"rollout.samples_per_prompt {samples} does not divide; set rollout.prompts_per_step, "
                f"or a samples_per_prompt that divides {values['batch']}"
            )
        overrides["rollout"] = {"prompts_per_step": values["batch"] // samples}

    objective_name = _section(config, "objective").get("name", ObjectiveConfig.model_fields["name"].default)
    if objective_name not in {spec.name for spec in list_objectives()}:
        return overrides
    objective = get_objective(objective_name)
    if objective.preset_clip is not None:
        overrides["objective"] = {"params": objective.preset_clip(values["clip"])}
    estimator_name = _section(config, "advantage").get("estimator") or objective.default_advantage
    if estimator_name in {spec.name for spec in list_advantages()} and "gammas" in get_advantage(estimator_name).requires:
        overrides["modalities"] = {"text": {"gamma": values["gamma"], "lam": values["lam"]}}
    return overrides
