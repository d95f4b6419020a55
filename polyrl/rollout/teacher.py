"""The teacher of on-policy distillation (config ``distill:``, docs/distillation.md): a fixed model
that scores the student's sampled tokens at collection time.

:meth:`Teacher.score` gives each completion the teacher's log-prob of every completion token
given the prompt and the tokens before it (``Completion.teacher_logprobs``): one batched forward
per micro-batch, no sampling, through the same :func:`polyrl.modeling.logprobs.token_logprobs`
the learner uses, at the rollout temperature (the student's log-probs are those of its tempered
distribution too, so both sides of the reverse KL are the same function of their logits). The
rows carry the scores with them, so an asynchronous run's batches are scored where they are
collected, and the pipeline (``polyrl.trainer.pipeline.teacher_advantages``) turns them into the
per-token term.

The teacher must share the student's tokenizer (:func:`check_same_tokenizer`): its log-probs are
read at the student's token ids. Distilling across tokenizers (aligning two token sequences of one
text) is later work.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import torch

from polyrl.config.base import ConfigError
from polyrl.config.distill import TeacherConfig
from polyrl.config.model import ModelConfig
from polyrl.core.types import Completion
from polyrl.engines.image_prompts import auto_model_class, model_takes_images
from polyrl.modeling.batches import pack_completions
from polyrl.modeling.logprobs import token_logprobs
from polyrl.policies.paths import check_model_dir, resolve_policy_path
from polyrl.policies.pretrained import converted_gguf_dir, is_gguf_path
from polyrl.runtime.precision import autocast

__all__ = ["PROBE_TEXT", "Teacher", "check_same_tokenizer", "resolve_teacher_path"]

# Text whose token ids both tokenizers must agree on: words, digits, punctuation, spacing, a
# non-ASCII letter and a CJK character (a byte-fallback or normaliser difference shows here).
PROBE_TEXT = "The teacher scores 17 + 25 = 42, then:\n  é 数 (x_1 != y) <tag>"


def resolve_teacher_path(teacher: TeacherConfig, *, cache_dir: str | None, run_path: str | Path | None = None) -> Path:
    """The teacher's model folder: ``path`` checked (a .gguf converted, cached), ``builtin`` built or
    converted (cached in ``cache_dir``), or for ``run`` the folder its checkpoint was exported to,
    ``run_path`` (the launcher resolves runs: :func:`polyrl.launch.arm_steps.resolve_teacher_run`)."""
    if teacher.path is not None:
        if is_gguf_path(teacher.path):
            return converted_gguf_dir(teacher.path, cache_dir, field="distill.teacher.path")
        return check_model_dir(teacher.path, field="distill.teacher.path")
    if teacher.builtin is not None:
        return resolve_policy_path(ModelConfig(builtin=teacher.builtin, cache_dir=cache_dir))
    if run_path is None:
        raise ConfigError(
            f"distill.teacher.run {teacher.run!r}: a run is found in the tracking store when polyrl run or polyrl submit "
            "starts the arm; an arm built directly (build_arm) needs its exported folder as teacher_path, or "
            "distill.teacher.path"
        )
    return Path(run_path)


def _vocab(tokenizer: Any) -> dict[str, int]:
    return dict(tokenizer.get_vocab())


def check_same_tokenizer(student: Any, teacher: Any, *, student_path: str | Path, teacher_path: str | Path) -> None:
    """Refuse a teacher whose tokenizer differs from the student's (vocabulary, end-of-sequence id, or
    the ids of :data:`PROBE_TEXT`), naming both models and each difference found."""
    differences = []
    student_vocab, teacher_vocab = _vocab(student), _vocab(teacher)
    if student_vocab != teacher_vocab:
        only_student = sorted(set(student_vocab) - set(teacher_vocab))[:3]
        only_teacher = sorted(set(teacher_vocab) - set(student_vocab))[:3]
        moved = [t for t in student_vocab if t in teacher_vocab and student_vocab[t] != teacher_vocab[t]][:3]
        differences.append(
            f"vocabularies differ ({len(student_vocab)} vs {len(teacher_vocab)} tokens; only the student's: {only_student}, "
            f"only the teacher's: {only_teacher}, other ids: {moved})"
        )
    # The end of a completion is a token the teacher scores too: the same id must mean "end" to both.
    if student.eos_token_id != teacher.eos_token_id:
        differences.append(f"eos_token_id {student.eos_token_id} vs {teacher.eos_token_id}")
    student_ids = student(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    teacher_ids = teacher(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    if student_ids != teacher_ids:
        differences.append(f"the probe text {PROBE_TEXT!r} encodes to {student_ids} vs {teacher_ids}")
    if differences:
        raise ConfigError(
            f"distill.teacher: the teacher {str(teacher_path)!r} does not share the student's tokenizer "
            f"({str(student_path)!r}): {'; '.join(differences)}. The teacher's log-probs are read at the student's token "
            "ids, so both must tokenize alike; cross-tokenizer distillation is later work (docs/distillation.md)"
        )


class Teacher:
    """A frozen teacher model and how it scores: at ``temperature``, ``micro_batch_size`` rows per
    forward, autocast in ``compute_dtype`` (fp32 weights, as the learner's), on its model's device."""

    def __init__(
        self,
        model: torch.nn.Module,
        path: str | Path,
        *,
        pad_token_id: int,
        temperature: float = 1.0,
        micro_batch_size: int = 8,
        compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model = model.eval()
        self.model.requires_grad_(False)
        self.path = Path(path)
        self.pad_token_id = pad_token_id
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size
        self.compute_dtype = compute_dtype
        # Asynchronous runs with several buffer partitions collect from several threads at once.
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path, *, device: torch.device | str = "cpu", **settings: Any) -> "Teacher":
        """The teacher model at ``path`` (fp32 weights) on ``device``; text models only."""
        if model_takes_images(path):
            raise ConfigError(
                f"distill.teacher: {str(path)!r} is an image-text model; distillation scores text completions only "
                "(image prompts are later work)"
            )
        model = auto_model_class(path).from_pretrained(str(path), dtype=torch.float32).to(device)
        return cls(model, path, **settings)

    @torch.no_grad()
    def logprobs(self, completions: Sequence[Completion]) -> torch.Tensor:
        """``[N, T]`` float32 on the CPU: the teacher's log-prob of each completion token (0 past a row's
        end and on an episode's observation tokens, as :func:`token_logprobs` leaves masked positions)."""
        packed = pack_completions(list(completions), pad_token_id=self.pad_token_id)
        device = next(self.model.parameters()).device
        parts = []
        with self._lock, autocast(self.model, self.compute_dtype):
            for start in range(0, len(packed), self.micro_batch_size):
                part = packed.select(slice(start, start + self.micro_batch_size)).to(device)
                parts.append(token_logprobs(self.model, part, temperature=self.temperature)[0].float().cpu())
        return torch.cat(parts)

    def score(self, completions: Sequence[Completion]) -> list[Completion]:
        """``completions`` with their ``teacher_logprobs`` filled in (new objects; the inputs are unchanged)."""
        if not completions:
            return []
        scored = self.logprobs(completions)
        return [
            replace(c, teacher_logprobs=tuple(scored[row, : len(c.completion_ids)].tolist())) for row, c in enumerate(completions)
        ]
