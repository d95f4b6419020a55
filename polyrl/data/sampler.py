"""The resumable prompt sampler: prompts in a seeded shuffled order, epoch after epoch."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import datasets

from polyrl.core.types import PromptSample
from polyrl.data.errors import DataConfigError
from polyrl.data.prompt_samples import rows_to_prompt_samples

__all__ = ["PromptSampler"]


class PromptSampler:
    """Prompts in a seeded shuffled order, epoch after epoch, with a resumable position.

    Epoch ``e`` visits every sample once in the order given by a ``random.Random`` seeded with
    ``(seed, e)``; ``next_batch`` continues into the next epoch when the current one runs out.
    ``state_dict()`` is ``{"epoch", "index", "seed", "num_samples"}``; loading it into a sampler
    over the same data makes it continue with the identical sequence.
    """

    def __init__(self, samples: Sequence[PromptSample] | datasets.Dataset, *, seed: int = 0, shuffle: bool = True, **fields: Any):
        if isinstance(samples, datasets.Dataset):
            samples = rows_to_prompt_samples(samples, **fields)
        elif fields:
            raise TypeError(f"field names {sorted(fields)} apply only to a datasets.Dataset")
        self.samples: list[PromptSample] = list(samples)
        if not self.samples:
            raise DataConfigError("PromptSampler needs at least one prompt")
        self.seed = int(seed)
        self.shuffle = shuffle
        self.epoch = 0
        self.index = 0
        self._order_epoch: int | None = None
        self._order: list[int] = []

    def __len__(self) -> int:
        return len(self.samples)

    def _epoch_order(self, epoch: int) -> list[int]:
        if self._order_epoch != epoch:
            order = list(range(len(self.samples)))
            if self.shuffle:
                random.Random(f"polyrl-prompt-sampler-{self.seed}-{epoch}").shuffle(order)
            self._order, self._order_epoch = order, epoch
        return self._order

    def next_batch(self, num_prompts: int, step: int | None = None) -> list[PromptSample]:
        """The next ``num_prompts`` prompts. ``step`` (the training step they are for) does not
        change a single source's order; a data mixture's weights may follow it
        (:class:`polyrl.data.mixtures.MixtureSampler`)."""
        if num_prompts <= 0:
            raise ValueError(f"num_prompts must be positive, got {num_prompts}")
        batch = []
        while len(batch) < num_prompts:
            order = self._epoch_order(self.epoch)
            take = min(num_prompts - len(batch), len(order) - self.index)
            batch.extend(self.samples[i] for i in order[self.index : self.index + take])
            self.index += take
            if self.index == len(order):
                self.epoch, self.index = self.epoch + 1, 0
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "num_samples": len(self.samples)}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        if "mixture" in state:
            raise ValueError(f"sampler state is a data mixture's ({list(state['mixture'])}), but this run has one data source")
        if int(state["num_samples"]) != len(self.samples):
            raise ValueError(f"sampler state is for {state['num_samples']} prompts but this sampler has {len(self.samples)}")
        if int(state["seed"]) != self.seed:
            raise ValueError(f"sampler state has seed {state['seed']} but this sampler has seed {self.seed}")
        index = int(state["index"])
        if not 0 <= index < len(self.samples):
            raise ValueError(f"sampler state index {index} is out of range for {len(self.samples)} prompts")
        self.epoch, self.index = int(state["epoch"]), index
