"""What ``--resume`` does with a config that differs from the run it continues.

A resumed arm must train on what its records say. The config it was last trained with is
stored in each checkpoint (``state["config"]``) and, for an arm with no checkpoint yet, in the
experiment folder's ``experiment.json``. On resume every difference is refused, naming each
key, unless ``--allow-config-change``; then the changes apply from the next step and the runner
records them (a tag on the arm run and the new resolved config as another artifact). Like
torchtitan and verl, which restore a checkpoint only into the job config it was written with,
some changes can never apply to a resumed arm; :data:`FROZEN_ON_RESUME` lists them and why.

``train.steps`` may grow, also for an arm that finished (train it longer: it continues from its
last checkpoint, and a linear or cosine schedule's horizon moves with it, which
:func:`schedule_note` states and the runner records), but never drop below the step the
checkpoint has reached.
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
    # The optimizer holds moments for the parameters that trained, in order: another set of frozen
    # parts gives it other parameter groups, and loading the saved state would fail (or misalign).
    "model.freeze": "the saved optimizer state holds moments for exactly the parameters that trained "
    "(set frozen parts when a run starts)",
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


def steps_change(found: list[ConfigChange]) -> ConfigChange | None:
    return next((change for change in found if change.key == "train.steps"), None)


def extends(found: list[ConfigChange]) -> bool:
    """Whether these changes raise ``train.steps`` (what lets a finished arm train on)."""
    change = steps_change(found)
    return change is not None and isinstance(change.old, int) and isinstance(change.new, int) and change.new > change.old


def _never_apply(changed: dict[str, list[ConfigChange]], finished: set[str], resume_steps: dict[str, int]) -> list[str]:
    """Changes no flag can make apply: fewer steps than the checkpoint has, or a finished arm
    changed without training it longer."""
    refused = []
    for arm, found in changed.items():
        steps, at = steps_change(found), resume_steps.get(arm, 0)
        if steps is not None and isinstance(steps.new, int) and steps.new < at:
            refused.append(
                f"  - arm {arm!r}: {steps.describe()} is below the step its checkpoint has reached ({at}); a run cannot "
                f"be shortened (start a new run without --resume for {steps.new} steps)"
            )
        elif arm in finished and not extends(found):
            refused.append(
                f"  - arm {arm!r} already finished (step {at}), so {describe_changes(found)} cannot apply to it; "
                f"to train it longer, raise train.steps above {at} (with --allow-config-change)"
            )
    return refused


def check_resume_changes(
    changes: dict[str, list[ConfigChange]], *, finished: set[str], allow: bool, resume_steps: dict[str, int]
) -> None:
    """Raise :class:`ConfigError` unless every change may apply; ``changes`` maps arm → changes."""
    changed = {arm: found for arm, found in changes.items() if found}
    if not changed:
        return
    if refused := _never_apply(changed, finished, resume_steps):
        raise ConfigError("--resume: these config changes cannot apply to the run it continues:\n" + "\n".join(refused))
    if not allow:
        lines = [f"  arm {arm!r} (resumes after step {resume_steps.get(arm, 0)}):" for arm in changed]
        body = "\n".join(line + "".join(f"\n    - {c.describe()}" for c in changed[arm]) for line, arm in zip(lines, changed))
        raise ConfigError(
            "--resume: the config differs from the one the run was trained with, and a resumed run would "
            f"continue under settings its records do not show:\n{body}\n"
            "Resume with the original config, start a new run (without --resume), or pass --allow-config-change "
            "to apply these changes from the next step (recorded on the arm's MLflow run)"
        )
    refused = []
    for arm, found in changed.items():
        for change in found:
            if change.key == CRITIC_KEY:
                refused.append(
                    f"  - arm {arm!r}: {change.describe()}: the checkpoint's model set (policy with or "
                    "without a value model) cannot change"
                )
            elif (reason := frozen_reason(change.key)) is not None:
                refused.append(f"  - arm {arm!r}: {change.describe()}: {reason}")
    if refused:
        raise ConfigError(
            "--allow-config-change: these changes cannot apply to a resumed run:\n"
            + "\n".join(refused)
            + "\nStart a new run (without --resume) to use them"
        )


def describe_changes(changes: list[ConfigChange]) -> str:
    return "; ".join(change.describe() for change in changes)


def schedule_note(config: ExperimentConfig, old_steps: int, resume_step: int) -> str:
    """What a new ``train.steps`` does to the learning-rate schedule from ``resume_step`` on, in words.

    The schedule is a function of the optimizer step and ``train.steps`` (:mod:`polyrl.learner.lr_schedule`),
    so a linear or cosine decay stretches to the new horizon: the rate rises again at the next step.
    """
    from polyrl.learner.lr_schedule import lr_factor

    t, new_steps, at = config.train, config.train.steps, resume_step
    head = f"train.steps {old_steps} → {new_steps}"
    if t.lr_schedule == "constant":
        return f"{head}: the learning-rate schedule is constant, so steps {at + 1}–{new_steps} train at train.learning_rate"
    per_step = t.updates_per_batch * t.mini_batches  # optimizer steps per training step

    def factor(optimizer_step: int, steps: int) -> float:
        return lr_factor(
            optimizer_step,
            schedule=t.lr_schedule,
            warmup_steps=t.warmup_steps,
            total_steps=steps * per_step,
            min_lr_ratio=t.min_lr_ratio,
        )

    return (
        f"{head}: the {t.lr_schedule} schedule's horizon moves from step {old_steps} to step {new_steps}; the learning rate was "
        f"{factor(at * per_step, old_steps):.3g} × train.learning_rate at step {at} and is {factor(at * per_step + 1, new_steps):.3g} × "
        f"at step {at + 1}, decaying to {t.min_lr_ratio:g} × by step {new_steps} (a run planned for {new_steps} steps from the "
        f"start was at {factor(at * per_step, new_steps):.3g} × at step {at})"
    )
