"""Shared pieces of the learner-correctness tests: arms built on the tiny policy, snapshots, and a
scripted rollout engine for the logic around generation (dynamic sampling, masking)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch

from polyrl.config.schema import resolve_arms
from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.engines.base import RolloutEngine
from polyrl.rollout.batches import Rollout
from polyrl.trainer.arm import Arm
from polyrl.trainer.build_arm import build_arm


def make_config(config_dict: dict, *, arm: str = "main"):
    return resolve_arms(config_dict)[arm]


@contextlib.contextmanager
def built(
    tmp_path: Path, config_dict: dict, *, arm: str = "main", logger=None, resume: bool = False, engine=None
) -> Iterator[Arm]:
    """The arm's roles built from ``config_dict`` (the runner's set-up), closed afterwards."""
    roles = build_arm(
        make_config(config_dict, arm=arm),
        arm=arm,
        arm_dir=Path(tmp_path) / "runs" / arm,
        logger=logger,
        resume=resume,
        engine=engine,
    )
    try:
        yield roles
    finally:
        roles.close()


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def changed_fraction(before: dict[str, torch.Tensor], model: torch.nn.Module) -> float:
    changed = sum(int((before[name] != p.detach()).sum()) for name, p in model.named_parameters())
    return changed / sum(p.numel() for p in model.parameters())


def first_batch(arm: Arm):
    collected = arm.collector.collect(1)
    return collected.rollout, collected.scores, arm.pipeline.run(collected.rollout, collected.scores)


def completion(tokenizer, prompt: str, text: str, *, truncated: bool = False, modalities: tuple[str, ...] = ()) -> Completion:
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return Completion(
        prompt_ids=list(tokenizer(prompt, add_special_tokens=False)["input_ids"]),
        completion_ids=ids,
        text=text,
        sampling_logprobs=[-1.0] * len(ids),
        finish_reason="length" if truncated else "stop",
        completion_token_modalities=modalities,
    )


def rollout_of(tokenizer, rows: list[tuple[int, str, bool]], prompt: str = "Q: 1+1=? A:") -> Rollout:
    """A rollout from ``(group id, text, truncated)`` rows, one prompt for all."""
    sample = PromptSample(prompt=prompt)
    return Rollout(
        [sample] * len(rows),
        [completion(tokenizer, prompt, text, truncated=t) for _, text, t in rows],
        torch.tensor([g for g, _, _ in rows], dtype=torch.long),
    )


class ScriptedEngine(RolloutEngine):
    """Answers the i-th ``generate`` call with ``rounds[i]``: one list of texts per prompt.

    A fake for the logic around a real engine (which groups enter the batch); the texts are
    tokenised with the policy's tokenizer, so the learner can score them for real.
    """

    name = "scripted"

    def __init__(self, tokenizer, rounds: list[list[list[str]]]):
        self.tokenizer = tokenizer
        self.rounds = rounds
        self.calls = 0

    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]:
        texts = self.rounds[self.calls]
        self.calls += 1
        assert len(texts) == len(prompts) and all(len(group) == settings.n for group in texts)
        return [[completion(self.tokenizer, p.prompt, text) for text in group] for p, group in zip(prompts, texts)]

    def sync_weights(self, named_tensors) -> None:
        for _ in named_tensors:
            pass
