"""Data mixtures (``data.sources``): each step's prompts drawn from several sources by weight.

Each source keeps its own :class:`~polyrl.data.sampler.PromptSampler` (its rows in a seeded
shuffled order, epoch after epoch). A step that draws ``n`` prompts gives source ``i`` a count
proportional to its weight at that step, ``w_i(step) / Σ w``, by largest remainders with the
remainders carried to the next draw (stratified, not random): with weights 0.75 / 0.25 and 2
prompts a step the second source gets one prompt every other step, so the realised shares
follow the weights within one prompt at any point of the run instead of drifting by chance.
The draw depends only on the sampler's state, so a run resumed from a checkpoint
(``state_dict``/``load_state_dict``) draws the same prompts as an uninterrupted one.

Every sample carries its source's name in ``fields["mixture_source"]``, which the rollout
collector reads for the per-source metrics (``train/source/<name>/accuracy``,
``reward/source/<name>/mean``, ``rollout/source/<name>/share``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from polyrl.core.types import PromptSample
from polyrl.data.errors import DataConfigError
from polyrl.data.sampler import PromptSampler

SOURCE_FIELD = "mixture_source"

__all__ = ["SOURCE_FIELD", "MixtureSampler", "draw_counts", "tag_samples"]


def tag_samples(samples: Sequence[PromptSample], name: str, *, source: str) -> list[PromptSample]:
    """``samples`` with ``fields["mixture_source"] = name``; a row that already has that column is refused."""
    for index, sample in enumerate(samples):
        if SOURCE_FIELD in sample.fields:
            raise DataConfigError(
                f"data.sources: the rows of {source!r} have a {SOURCE_FIELD!r} column (row {index}), the column a mixture "
                "names each row's source in; rename it"
            )
    return [dataclasses.replace(sample, fields={**sample.fields, SOURCE_FIELD: name}) for sample in samples]


def draw_counts(weights: Sequence[float], count: int, carried: Sequence[float]) -> tuple[list[int], list[float]]:
    """How many of ``count`` prompts each source gives, and the remainders carried to the next draw.

    Source ``i`` is owed ``carried[i] + count * w_i / Σ w``; each gets the whole part of what it
    is owed and the prompts left over go to the largest fractional parts (ties: the earlier
    source). A source of weight 0 gets nothing and owes nothing. E.g. weights (3, 1), count 2, no
    carry: owed (1.5, 0.5), whole parts (1, 0), the last prompt to the first source (fraction 0.5
    ties and the earlier wins): counts (2, 0), carried (-0.5, 0.5); the next draw owes (1.0, 1.0):
    counts (1, 1).
    """
    total = sum(weights)
    if not total > 0:
        raise ValueError(f"the mixture's weights {list(weights)} sum to {total}: nothing to draw from")
    owed = [(c + count * w / total) if w > 0 else 0.0 for w, c in zip(weights, carried)]
    counts = [max(0, math.floor(o)) for o in owed]
    left = count - sum(counts)
    order = sorted((i for i, w in enumerate(weights) if w > 0), key=lambda i: (-(owed[i] - counts[i]), i))
    for i in order[: max(left, 0)]:
        counts[i] += 1
    while sum(counts) > count:  # owed past the count after a weight fell: take back from the most served
        i = max(range(len(counts)), key=lambda j: (counts[j] - owed[j], -j))
        counts[i] -= 1
    return counts, [o - c if w > 0 else 0.0 for o, c, w in zip(owed, counts, weights)]


class MixtureSampler:
    """Prompts from several sources by weight (see the module docstring).

    ``weights[i](step)`` is source ``i``'s weight at a training step (a number, or a schedule);
    ``scheduled``: whether any weight changes with the step, in which case every draw must say
    its step. ``samples`` is every source's samples, in source order (what a single sampler's
    ``samples`` is: the training rows).
    """

    def __init__(
        self,
        parts: Sequence[tuple[str, Sequence[PromptSample]]],
        weights: Sequence[Callable[[int], float]],
        *,
        seed: int = 0,
        scheduled: bool = False,
    ):
        if not parts or len(parts) != len(weights):
            raise ValueError(f"a mixture needs one weight per source: {len(parts)} sources, {len(weights)} weights")
        self.names = [name for name, _ in parts]
        # Each source its own order: the run seed and the source's place (two sources of equal
        # size do not share a permutation).
        self.samplers = [PromptSampler(list(samples), seed=seed * 1_000 + index) for index, (_, samples) in enumerate(parts)]
        self.samples: list[PromptSample] = [s for sampler in self.samplers for s in sampler.samples]
        self.weights = list(weights)
        self.seed = int(seed)
        self.scheduled = scheduled
        self.carried = [0.0] * len(parts)

    @classmethod
    def from_config(cls, samples: Sequence[PromptSample], sources: Sequence[Any], *, seed: int = 0) -> "MixtureSampler":
        """A mixture over tagged ``samples`` (``fields["mixture_source"]``) for ``data.sources``."""
        by_name: dict[str, list[PromptSample]] = {source.label: [] for source in sources}
        for sample in samples:
            by_name[sample.fields[SOURCE_FIELD]].append(sample)
        empty = [name for name, rows in by_name.items() if not rows]
        if empty:
            raise DataConfigError(f"data.sources: source(s) {empty} have no rows")
        return cls(
            [(source.label, by_name[source.label]) for source in sources],
            [source.weight_at for source in sources],
            seed=seed,
            scheduled=any(source.scheduled for source in sources),
        )

    def __len__(self) -> int:
        return len(self.samples)

    def weights_at(self, step: int | None) -> list[float]:
        if step is None:
            if self.scheduled:
                raise ValueError("a data mixture whose weights follow a schedule draws with the step the prompts are for")
            step = 0
        return [float(weight(step)) for weight in self.weights]

    def next_batch(self, num_prompts: int, step: int | None = None) -> list[PromptSample]:
        """The next ``num_prompts`` prompts for training step ``step``, source by source."""
        if num_prompts <= 0:
            raise ValueError(f"num_prompts must be positive, got {num_prompts}")
        counts, self.carried = draw_counts(self.weights_at(step), num_prompts, self.carried)
        batch: list[PromptSample] = []
        for sampler, count in zip(self.samplers, counts):
            if count:
                batch.extend(sampler.next_batch(count))
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "mixture": list(self.names),
            "seed": self.seed,
            "carried": list(self.carried),
            "sources": {name: sampler.state_dict() for name, sampler in zip(self.names, self.samplers)},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "mixture" not in state:
            raise ValueError("sampler state is a single source's, but this run draws from a mixture (data.sources)")
        if list(state["mixture"]) != self.names:
            raise ValueError(f"sampler state is for the mixture {list(state['mixture'])} but this run's is {self.names}")
        if int(state["seed"]) != self.seed:
            raise ValueError(f"sampler state has seed {state['seed']} but this sampler has seed {self.seed}")
        for name, sampler in zip(self.names, self.samplers):
            sampler.load_state_dict(state["sources"][name])
        self.carried = [float(value) for value in state["carried"]]
