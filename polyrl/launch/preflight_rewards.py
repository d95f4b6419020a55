"""Pre-flight checks of an arm's rewards: every reward module built from its spec (not set up:
heavy resources load in ``setup``), its label distinct, and ``tracking.accuracy_reward`` naming one."""

from __future__ import annotations

from polyrl.config.schema import ConfigError, ExperimentConfig
from polyrl.policies.pretrained import PRETRAINED, packaged_gguf
from polyrl.rewards import RewardConfigError, RewardSpec
from polyrl.rewards.base import module_label
from polyrl.rewards.registry import bind_params, build_reward

__all__ = ["EMPTY_REWARDS", "accuracy_problems", "reward_labels", "reward_problems"]

EMPTY_REWARDS = "rewards: the list is empty; an experiment needs at least one reward module, e.g. rewards: [{module: accuracy}]"


def reward_problems(specs: list[RewardSpec], *, model_path: str | None = None, image_text_policy: bool = False) -> list[str]:
    """One line per reward that cannot be built, each starting with its field path. ``image_text_policy``:
    the policy reads images, so a reward that would score text with the policy's own folder (a causal
    LM loader) cannot load it."""
    if not specs:
        return [EMPTY_REWARDS]
    problems: list[str] = []
    labels: dict[str, int] = {}
    for index, spec in enumerate(specs):
        try:
            cls = spec.resolve()
        except RewardConfigError as error:
            problems.append(f"rewards[{index}].module: {error}")
            continue
        label = spec.name or module_label(cls)
        if label in labels:
            problems.append(
                f"rewards[{index}]: labelled {label!r} like rewards[{labels[label]}]; give one of them a distinct 'name'"
            )
        labels.setdefault(label, index)
        params = dict(spec.params)
        # A reward that declares policy_path_param gets the policy's folder there in training
        # (trainer/build_data.py); without a model.path that folder is only known once the built-in
        # policy is built.
        param = getattr(cls, "policy_path_param", None)
        injected = bool(param) and param not in params
        if injected and image_text_policy:
            problems.append(
                f"rewards[{index}].params.{param}: {label!r} scores text with the policy's starting model when "
                f"{param} is not given, but the policy is an image-text model, which it cannot load as a text "
                f"model; give {param}: a text model's folder or a built-in one's name ({', '.join(PRETRAINED)})"
            )
            continue
        if injected:
            params[param] = model_path or "<built-in policy>"
        elif param and isinstance(params[param], str) and params[param] in PRETRAINED:
            try:
                packaged_gguf(params[param])  # the package that ships it is installed
            except ConfigError as error:
                problems.append(f"rewards[{index}].params.{param}: {error}")
                continue
        try:
            bind_params(cls, params, ref=spec.module, label=label)
            if not injected or model_path:
                build_reward(cls, params, ref=spec.module, label=label)
        except RewardConfigError as error:
            problems.append(f"rewards[{index}]: {error}")
    return problems


def accuracy_problems(config: ExperimentConfig, labels: list[str]) -> list[str]:
    wanted = config.tracking.accuracy_reward
    if wanted is None or wanted in labels:
        return []
    return [f"tracking.accuracy_reward: no reward is labelled {wanted!r}; reward labels: {', '.join(labels)}"]


def reward_labels(specs: list[RewardSpec]) -> list[str]:
    labels = []
    for spec in specs:
        try:
            labels.append(spec.name or module_label(spec.resolve()))
        except RewardConfigError:
            continue
    return labels
