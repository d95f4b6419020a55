"""``distill:``: on-policy distillation from a teacher model (docs/distillation.md).

The student samples as usual; a fixed teacher scores each sampled token (its log-probability of
the token given the prompt and the tokens before it: one forward pass, no sampling), and the
per-token reverse KL estimate ``log π_student(y_t) − log π_teacher(y_t)`` becomes a per-token
advantage term ``−coef × (log π_student − log π_teacher)`` (Agarwal et al., "On-Policy
Distillation of Language Models: Learning from Self-Generated Mistakes", arXiv 2306.13649, the
reverse-KL case of GKD with on-policy student samples; Thinking Machines, "On-Policy
Distillation", 2025: the negative reverse KL as a per-token reward with discount 0).

:func:`distill_refusals` holds the checks against the rest of the experiment, raised by
:class:`polyrl.config.experiment.ExperimentConfig` with their field paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from polyrl.config.base import StrictModel
from polyrl.config.model import VLM_TASKS, BuiltinModelConfig
from polyrl.core.run_refs import split_run_ref

__all__ = ["DistillConfig", "TeacherConfig", "distill_refusals", "parse_teacher_run", "teacher_uses_cache"]


def teacher_uses_cache(distill: "DistillConfig | None") -> bool:
    """Whether ``distill``'s teacher is kept in model.cache_dir: a built-in model, a converted .gguf file,
    or a run's exported checkpoint (a model folder is used where it is)."""
    if distill is None:
        return False
    teacher = distill.teacher
    return teacher.builtin is not None or teacher.run is not None or Path(teacher.path or "").suffix.lower() == ".gguf"


def parse_teacher_run(ref: str) -> tuple[str, int | None]:
    """``<run_id>[@<step>]`` (``run:`` in front allowed) → ``(run id, step or None)``; a ``ValueError`` otherwise."""
    try:
        return split_run_ref(ref)
    except ValueError as error:
        raise ValueError(f"{ref!r}: {error}") from None


class TeacherConfig(StrictModel):
    """The teacher: any model polyrl can load, named in exactly one way (path, builtin or run). Its tokenizer
    must equal the student's; a teacher with another tokenizer is refused when the arm is built."""

    path: str | None = Field(
        None,
        description="A local Hugging Face model folder, or a .gguf file (converted once into model.cache_dir, as a policy's).",
    )
    builtin: BuiltinModelConfig | None = Field(
        None,
        description="A built-in model, written as model.builtin is: {name: smollm2-135m-instruct}, or a tiny "
        "warmed-up policy ({size: 3m, seed: 1, ...}); cached in model.cache_dir.",
    )
    run: str | None = Field(
        None,
        description="A polyrl training run's checkpoint: '<run_id>' (its latest complete checkpoint) or "
        "'<run_id>@<step>' ('run:' in front allowed), found and exported as `polyrl eval --model run:<id>` does, in "
        "tracking.uri's store. Resolved by polyrl run / submit when the arm starts.",
    )

    @field_validator("run")
    @classmethod
    def _run_reference(cls, ref: str | None) -> str | None:
        if ref is not None:
            parse_teacher_run(ref)
        return ref

    @model_validator(mode="after")
    def _one_source(self) -> "TeacherConfig":
        given = [name for name in ("path", "builtin", "run") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"name the teacher in exactly one way, got {len(given)} ({', '.join(given) or 'none'}); allowed: "
                "path (a model folder or .gguf file), builtin (e.g. {name: smollm2-135m-instruct}) or run (<run_id>[@<step>])"
            )
        if self.builtin is not None and self.builtin.name is None and self.builtin.task in VLM_TASKS:
            raise ValueError(
                f"builtin.task {self.builtin.task!r} is an image-text model; distillation scores text completions only "
                "(image prompts are later work); allowed: a text model"
            )
        return self


class DistillConfig(StrictModel):
    """On-policy distillation: a fixed teacher scores the student's sampled tokens, and the negative per-token
    reverse KL, −coef × (log π_student − log π_teacher), is added to each token's advantage (docs/distillation.md)."""

    teacher: TeacherConfig = Field(..., description="The teacher model (section below).")
    engine: Literal["hf"] = Field(
        "hf",
        description="What scores the teacher's log-probs: 'hf', the teacher as a transformers model beside the learner "
        "(one batched forward per step, micro-batches of train.micro_batch_size, on the learner's device, in "
        "model.dtype). vLLM's prompt log-probs are later work.",
    )
    coef: float = Field(
        1.0,
        gt=0,
        description="Weight of the teacher term: each policy token's advantage gets −coef × (log π_student − "
        "log π_teacher), with the sampler's log-probs as log π_student.",
    )
    task_reward: bool = Field(
        True,
        description="true: the teacher term is added to the advantages the run's estimator computes from the rewards "
        "(distillation on top of the task reward). false: pure distillation, the advantage is the teacher term alone "
        "(discount 0, no group normalisation); the rewards are then computed and logged (train/accuracy) but train nothing.",
    )


# What pure distillation (task_reward: false) cannot honour: each would act on the reward-based
# advantage, which pure distillation never computes.
def distill_refusals(cfg: Any) -> list[tuple[tuple[str, ...], str, Any]]:
    """``distill`` against the rest of the experiment: ``(field path, message, value)`` per refusal."""
    from polyrl.algos.advantages import get_advantage
    from polyrl.algos.objectives import get_objective

    d = cfg.distill
    if d is None or d.task_reward:
        return []
    pure = "distill.task_reward is false (pure distillation: the advantage is the teacher term alone)"
    refusals: list[tuple[tuple[str, ...], str, Any]] = []
    name = cfg.advantage.estimator or get_objective(cfg.objective.name).default_advantage
    requires = get_advantage(name).requires
    if "values" in requires or "baselines" in requires:
        what = (
            "a critic trained on the task reward's returns" if "values" in requires else "a greedy baseline completion per prompt"
        )
        refusals.append(
            (
                ("advantage", "estimator"),
                f"{pure}, but the estimator {name!r} (objective {cfg.objective.name!r}'s default, unless advantage.estimator names it) needs {what}, "
                "which would train or cost for nothing; allowed here: an objective whose estimator is a group one "
                "(grpo, dr_grpo, dapo, gspo, ...), or distill.task_reward: true",
                name,
            )
        )
    else:
        for field, written in (("estimator", cfg.advantage.estimator), ("params", cfg.advantage.params)):
            if written:
                refusals.append(
                    (("advantage", field), f"{pure}, so no estimator runs; allowed here: no advantage.{field}", written)
                )
    others = (
        (("advantage", "dynamic_sampling", "enabled"), cfg.advantage.dynamic_sampling.enabled,
         "it drops groups whose rewards agree, and the rewards train nothing here; allowed here: enabled: false"),
        (("advantage", "overlong", "mode"), cfg.advantage.overlong.mode == "soft_punishment",
         "'soft_punishment' shapes the reward, which trains nothing here; allowed here: mode: off or mask_truncated"),
        (("train", "kl_in_reward"), cfg.train.kl_in_reward,
         "it folds the KL into the rewards, which train nothing here; allowed here: kl_in_reward: false (the KL then "
         "enters the loss)"),
        (("advantage", "reward_aggregation"), cfg.advantage.reward_aggregation == "gdpo",
         "'gdpo' combines the rewards into the advantage, which is the teacher term here; allowed here: sum"),
    )  # fmt: skip
    refusals += [(path, f"{pure}, but {why}", True) for path, active, why in others if active]
    return refusals
