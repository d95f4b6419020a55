"""What ``--resume`` does with a config that differs from the run it continues.

A resumed arm must train on what its records say. The config it was last trained with is
stored in each checkpoint (``state["config"]``) and, for an arm with no checkpoint yet, in the
experiment folder's ``experiment.json``. On resume every difference is refused, naming each
key, unless ``--allow-config-change``; then the changes apply from the next step and the runner
records them (a tag on the arm run and the new resolved config as another artifact). Like
torchtitan and verl, which restore a checkpoint only into the job config it was written with,
some changes can never apply to a resumed arm; :data:`FROZEN_ON_RESUME` lists them and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polyrl.config.schema import ConfigError, ExperimentConfig, flatten

# Dotted prefixes that a resumed arm cannot take a new value for, and why.
FROZEN_ON_RESUME: dict[str, str] = {
    # The checkpoint holds this model's weights and optimizer moments: another folder, size or
    # dtype means other shapes (a crash) or other numerics than the ones trained so far.
    "model.path": "the checkpoint holds the weights of the model it was trained from",
    "model.builtin": "the checkpoint holds the weights of the model it was trained from",
    "model.dtype": "the weights and optimizer state were trained in that dtype",
    "model.lora": "the checkpoint holds either a LoRA adapter of those settings or full weights",
    # The saved data position is an index into this exact dataset and its shuffled order.
    "data.source": "the saved data position indexes into that dataset",
    "data.train_split": "the saved data position indexes into that dataset",
    "data.limit": "the saved data position indexes into that dataset",
    "data.holdout": "the saved data position indexes into that dataset",
    "data.prompt_field": "the saved data position indexes into rows read with that field",
    "data.answer_field": "the saved data position indexes into rows read with that field",
    "data.references_field": "the saved data position indexes into rows read with that field",
    # The data order and every random stream restored from the checkpoint derive from it.
    "seed": "the data order and the random state restored from the checkpoint come from the seed",
    # Where the run's records live: changing them would split one run in two places.
    "name": "the run's checkpoints and records are found by it",
    "checkpoint.dir": "the run's checkpoints are found there",
    "tracking.uri": "the run's MLflow runs live in that store",
    "tracking.experiment": "the run's MLflow runs live in that experiment",
}
CRITIC_KEY = "critic (advantage estimator needing values)"
ABSENT = "<absent>"


@dataclass(frozen=True)
class ConfigChange:
    key: str
    old: Any
    new: Any

    def describe(self) -> str:
        return f"{self.key}: {_show(self.old)} → {_show(self.new)}"


def _show(value: Any) -> str:
    return value if value == ABSENT else repr(value)


def config_snapshot(config: ExperimentConfig) -> dict[str, Any]:
    """The JSON form stored with a run and compared on resume."""
    return config.model_dump(mode="json")


def diff_configs(old: dict[str, Any], new: dict[str, Any]) -> list[ConfigChange]:
    """Every dotted key whose value differs (added and removed keys included), sorted."""
    before, after = flatten(old), flatten(new)
    changes = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key, ABSENT), after.get(key, ABSENT)
        if a != b:
            changes.append(ConfigChange(key, a, b))
    return changes


def frozen_reason(key: str) -> str | None:
    for prefix, reason in FROZEN_ON_RESUME.items():
        if key == prefix or key.startswith(prefix + "."):
            return reason
    return None


def needs_critic(config: dict[str, Any]) -> bool | None:
    """Whether an arm trains a value model (its checkpoint then holds one); None if unknown."""
    try:
        from polyrl.algos.advantages import get_advantage
        from polyrl.algos.objectives import get_objective

        name = config["advantage"]["estimator"] or get_objective(config["objective"]["name"]).default_advantage
        return "values" in get_advantage(name).requires
    except Exception:  # noqa: BLE001 - an unknown name is the config validator's to report
        return None


def resume_changes(arm: str, old: dict[str, Any], new: dict[str, Any]) -> list[ConfigChange]:
    changes = diff_configs(old, new)
    old_critic, new_critic = needs_critic(old), needs_critic(new)
    if None not in (old_critic, new_critic) and old_critic != new_critic:
        changes.append(ConfigChange(CRITIC_KEY, "yes" if old_critic else "no", "yes" if new_critic else "no"))
    return changes


def check_resume_changes(changes: dict[str, list[ConfigChange]], *, finished: set[str], allow: bool,
                         resume_steps: dict[str, int]) -> None:
    """Raise :class:`ConfigError` unless every change may apply; ``changes`` maps arm → changes."""
    changed = {arm: found for arm, found in changes.items() if found}
    if not changed:
        return
    if not allow:
        lines = [f"  arm {arm!r} (resumes after step {resume_steps.get(arm, 0)}):" for arm in changed]
        body = "\n".join(line + "".join(f"\n    - {c.describe()}" for c in changed[arm]) for line, arm in zip(lines, changed))
        raise ConfigError(
            "--resume: the config differs from the one the run was trained with, and a resumed run would "
            f"continue under settings its records do not show:\n{body}\n"
            "Resume with the original config, start a new run (without --resume), or pass --allow-config-change "
            "to apply these changes from the next step (recorded on the arm's MLflow run)")
    refused = []
    for arm, found in changed.items():
        for change in found:
            if arm in finished:
                refused.append(f"  - arm {arm!r} already finished, so {change.describe()} cannot apply to it")
            elif change.key == CRITIC_KEY:
                refused.append(f"  - arm {arm!r}: {change.describe()}: the checkpoint's model set (policy with or "
                               "without a value model) cannot change")
            elif (reason := frozen_reason(change.key)) is not None:
                refused.append(f"  - arm {arm!r}: {change.describe()}: {reason}")
    if refused:
        raise ConfigError("--allow-config-change: these changes cannot apply to a resumed run:\n" + "\n".join(refused)
                          + "\nStart a new run (without --resume) to use them")


def describe_changes(changes: list[ConfigChange]) -> str:
    return "; ".join(change.describe() for change in changes)
