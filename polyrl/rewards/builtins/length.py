"""Length rewards: a linear bonus, distance to a target, or DAPO's soft overlong punishment."""

from __future__ import annotations

from typing import Any, Literal

import torch

from polyrl.algos.dapo_data import dapo_overlong_penalty
from polyrl.rewards.base import RewardBatch, RewardConfigError, RewardModule
from polyrl.rewards.registry import register_reward


@register_reward("length")
class Length(RewardModule):
    """A reward computed from the completion's length L (characters or tokens).

    One shaping is used, chosen by the parameters:
    - default: ``L / scale`` (len/100 in polyrl's own composite reward);
    - ``target`` given: ``−|L − target| / scale``;
    - ``overlong_max_length`` given: DAPO's soft overlong punishment (Yu et al. 2025, "DAPO",
      arXiv 2503.14476): 0 if L ≤ L_max − L_cache, linear down to −1 at L_max, −1 beyond, with
      L_max = ``overlong_max_length`` and L_cache = ``overlong_cache_length``.
    ``cap`` (if given) bounds the reward from above in every mode: ``min(reward, cap)``.

    Deviation from DAPO: the paper counts the tokens the sampler generated; this module
    re-tokenises the completion text (``unit: tokens`` with ``tokenizer_path``), which can differ
    by a token or two at the edges. Use the trainer's overlong shaping (on token ids) when the
    exact count matters.

    Params:
        unit: "chars" (default) or "tokens".
        tokenizer_path: local Hugging Face tokenizer directory, required for ``unit: tokens``.
        scale: length per unit of reward in the linear and target modes (default 100).
        target: target length for the distance mode.
        cap: upper bound on the reward.
        overlong_max_length: L_max of the overlong punishment.
        overlong_cache_length: L_cache of the overlong punishment (required with L_max;
            0 < L_cache ≤ L_max).
    """

    def __init__(
        self,
        unit: Literal["chars", "tokens"] = "chars",
        tokenizer_path: str | None = None,
        scale: float = 100.0,
        target: float | None = None,
        cap: float | None = None,
        overlong_max_length: int | None = None,
        overlong_cache_length: int | None = None,
    ):
        if unit not in ("chars", "tokens"):
            raise RewardConfigError(f"length: unit must be 'chars' or 'tokens', got {unit!r}")
        if unit == "tokens" and not tokenizer_path:
            raise RewardConfigError("length: unit 'tokens' needs tokenizer_path")
        if scale <= 0:
            raise RewardConfigError(f"length: scale must be > 0, got {scale}")
        if target is not None and overlong_max_length is not None:
            raise RewardConfigError("length: give either target or overlong_max_length, not both (use two reward entries)")
        if overlong_max_length is not None:
            if overlong_cache_length is None:
                raise RewardConfigError("length: overlong_max_length needs overlong_cache_length")
            if not 0 < overlong_cache_length <= overlong_max_length:
                raise RewardConfigError(
                    f"length: need 0 < overlong_cache_length ({overlong_cache_length}) <= overlong_max_length ({overlong_max_length})"
                )
        elif overlong_cache_length is not None:
            raise RewardConfigError("length: overlong_cache_length needs overlong_max_length")
        self.unit = unit
        self.tokenizer_path = tokenizer_path
        self.scale = float(scale)
        self.target = target
        self.cap = cap
        self.overlong_max_length = overlong_max_length
        self.overlong_cache_length = overlong_cache_length
        self._tokenizer: Any = None

    def setup(self) -> None:
        if self.unit == "tokens" and self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)

    def lengths(self, batch: RewardBatch) -> list[int]:
        if self.unit == "chars":
            return [len(c) for c in batch.completions]
        if self._tokenizer is None:
            self.setup()
        encoded = self._tokenizer(list(batch.completions), add_special_tokens=False)["input_ids"]
        return [len(ids) for ids in encoded]

    def reward(self, length: float) -> float:
        if self.overlong_max_length is not None:
            lengths = torch.tensor([float(length)], dtype=torch.float64)
            value = float(
                dapo_overlong_penalty(lengths, max_length=self.overlong_max_length, cache_length=self.overlong_cache_length)[0]
            )
        elif self.target is not None:
            value = -abs(length - self.target) / self.scale
        else:
            value = length / self.scale
        return value if self.cap is None else min(value, float(self.cap))

    def score(self, batch: RewardBatch) -> list[float | None]:
        return [self.reward(n) for n in self.lengths(batch)]
