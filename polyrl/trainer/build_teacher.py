"""Building an arm's distillation teacher from ``distill:`` (docs/distillation.md): where its model
comes from, the refusals that cost nothing (a teacher with another tokenizer, an image policy)
before any model loads, then the :class:`~polyrl.rollout.teacher.Teacher` on the learner's device.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from polyrl.config.base import ConfigError
from polyrl.config.schema import ExperimentConfig
from polyrl.engines.image_prompts import model_takes_images
from polyrl.rollout.teacher import Teacher, check_same_tokenizer, resolve_teacher_path

__all__ = ["TeacherSource", "build_teacher", "teacher_source"]


@dataclass(frozen=True)
class TeacherSource:
    path: Path  # the teacher's model folder
    note: str | None = None  # said when the loop starts (self-distillation)


def teacher_source(
    cfg: ExperimentConfig, policy_path: Path, tokenizer: Any, *, run_path: str | Path | None = None
) -> TeacherSource | None:
    """The teacher's folder for ``cfg.distill`` (None without it), checked against the student: its
    tokenizer must be the student's, and neither may take images. ``run_path``: the folder a
    ``distill.teacher.run`` was exported to (the launcher resolves runs)."""
    if cfg.distill is None:
        return None
    if model_takes_images(policy_path):
        raise ConfigError(
            f"distill: the policy {str(policy_path)!r} is an image-text model; distillation scores text completions "
            "only (image prompts are later work); allowed here: a text policy, or no distill"
        )
    path = resolve_teacher_path(cfg.distill.teacher, cache_dir=cfg.model.cache_dir, run_path=run_path)
    check_same_tokenizer(tokenizer, AutoTokenizer.from_pretrained(str(path)), student_path=policy_path, teacher_path=path)
    note = None
    if Path(path).resolve() == Path(policy_path).resolve():
        note = (
            f"distill.teacher is the student's own starting model ({path}): self-distillation. The reverse KL starts at "
            "0 and the teacher term only pulls the student back towards where it started (a KL anchor to it)"
        )
    return TeacherSource(Path(path), note)


def build_teacher(cfg: ExperimentConfig, source: TeacherSource, *, device: Any, dtype: Any, pad_token_id: int) -> Teacher:
    """The teacher model on the learner's ``device``, scoring at the rollout temperature, in
    ``train.micro_batch_size`` rows per forward and autocast in the learner's compute ``dtype``."""
    return Teacher.load(
        source.path,
        device=device,
        pad_token_id=pad_token_id,
        temperature=cfg.rollout.temperature,
        micro_batch_size=cfg.train.micro_batch_size,
        compute_dtype=dtype,
    )
