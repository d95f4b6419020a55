"""``reasoning_gym``: a completion scored by the reasoning-gym task its row was generated from.

reasoning-gym (Stojanovski et al., "REASONING GYM: Reasoning Environments for Reinforcement
Learning with Verifiable Rewards", arXiv 2505.24760) generates each item from ``(task, config,
index)`` alone: item ``i`` of a generator seeded ``s`` is drawn with ``Random(s + i)``. A row of
data source ``reasoning_gym:<task>`` (:mod:`polyrl.data.reasoning_gym`) therefore carries the
coordinates of its item (column ``reasoning_gym``: a JSON object ``{"task", "config", "index"}``)
rather than a copy of it, and this module makes the item again and scores with the generator's
own ``score_answer(answer, entry)``. A copy would not do: JSON turns the tuples of an entry's
metadata into lists, and the ARC tasks' ``score_answer`` then gives a right answer 0.05.

The answer is what the completion puts between ``<answer>`` and ``</answer>`` (reasoning-gym's
``extract_answer``, the last such pair; ``extract: full`` takes the whole completion instead, and
``extract: last_number`` its last number, for a small chat model that answers "The GCD of 41 and 6
is 1." and never writes the tags).
A completion without the tags is scored as no answer (``score_answer(None, entry)``: 0). A
row without the ``reasoning_gym`` column is not a reasoning-gym item: it is refused, naming the
columns the row has.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Literal

from polyrl.rewards.base import RewardBatch, RewardConfigError, RewardModule, RewardModuleError
from polyrl.rewards.builtins.accuracy import extract_last_number
from polyrl.rewards.registry import register_reward

# The row column holding an item's coordinates (written by polyrl/data/reasoning_gym.py).
ENTRY_FIELD = "reasoning_gym"
INSTALL_HINT = "pip install 'polyrl[envs]'"
EXTRACT_MODES = ("tags", "full", "last_number")
# Items kept made; a training step scores G samples of the same few rows.
_ENTRY_CACHE_SIZE = 4096

__all__ = ["ENTRY_FIELD", "INSTALL_HINT", "ReasoningGymScore", "entry_coordinates", "import_reasoning_gym", "make_entry"]


def import_reasoning_gym(what: str) -> Any:
    """The ``reasoning_gym`` package, or an error saying which extra installs it."""
    try:
        import reasoning_gym
    except ImportError as error:
        raise RewardConfigError(f"{what} needs the reasoning-gym package, which is not installed: {INSTALL_HINT}") from error
    return reasoning_gym


def entry_coordinates(task: str, config: dict[str, Any], index: int) -> str:
    """The ``reasoning_gym`` column of a row: which generator made it and at which index."""
    return json.dumps({"task": task, "config": config, "index": int(index)}, sort_keys=True)


_DATASETS: dict[str, Any] = {}


def generator(task: str, config: dict[str, Any]) -> Any:
    """reasoning-gym's dataset object for ``task`` with ``config`` (its ``seed`` and ``size``
    included), made once per process."""
    key = json.dumps([task, config], sort_keys=True)
    if key not in _DATASETS:
        _DATASETS[key] = import_reasoning_gym("reasoning-gym scoring").create_dataset(task, **config)
    return _DATASETS[key]


_ENTRIES: OrderedDict[str, dict[str, Any]] = OrderedDict()


def make_entry(coordinates: str) -> tuple[Any, dict[str, Any]]:
    """The generator and the item (``question``, ``answer``, ``metadata``) that ``coordinates``
    (a row's ``reasoning_gym`` column) name, made again exactly as the data source made them."""
    spec = json.loads(coordinates)
    dataset = generator(spec["task"], spec["config"])
    entry = _ENTRIES.get(coordinates)
    if entry is None:
        entry = dataset[int(spec["index"])]
        _ENTRIES[coordinates] = entry
        if len(_ENTRIES) > _ENTRY_CACHE_SIZE:
            _ENTRIES.popitem(last=False)
    else:
        _ENTRIES.move_to_end(coordinates)
    return dataset, entry


@register_reward("reasoning_gym")
class ReasoningGymScore(RewardModule):
    """Score with the reasoning-gym task's own ``score_answer`` (in [0, 1]; 1 is right).

    Params: ``extract`` — ``tags`` (default: the text between the last ``<answer>`` and
    ``</answer>``, as reasoning-gym's prompts ask), ``full`` (the whole completion, stripped) or
    ``last_number`` (the completion's last number, thousands commas dropped: for tasks whose answer
    is one number; a list or a word answer is then never read right).
    A task whose ``score_answer`` raises on a malformed answer (``prime_factorization`` on a
    word) scores it 0: the answer is not one the task can read.
    """

    def __init__(self, extract: Literal["tags", "full", "last_number"] = "tags"):
        if extract not in EXTRACT_MODES:
            raise RewardConfigError(f"reasoning_gym: params.extract {extract!r} is not one of {list(EXTRACT_MODES)}")
        self.extract = extract

    def setup(self) -> None:
        import_reasoning_gym("reward module reasoning_gym")

    def answer(self, completion: str) -> str | None:
        if self.extract == "full":
            return completion.strip() or None
        if self.extract == "last_number":
            number = extract_last_number(completion)
            return None if number is None else number.replace(",", "")
        from reasoning_gym.utils import extract_answer

        return extract_answer(completion, tag_name="answer")

    def score(self, batch: RewardBatch) -> list[float | None]:
        scores: list[float | None] = []
        for index, (completion, fields) in enumerate(zip(batch.completions, batch.fields)):
            coordinates = fields.get(ENTRY_FIELD)
            if not isinstance(coordinates, str):
                raise RewardModuleError(
                    f"reasoning_gym scores rows of data source reasoning_gym:<task> (column {ENTRY_FIELD!r}); "
                    f"{batch.sample(index)} has the columns {', '.join(sorted(fields)) or '(none)'}",
                    label=self.name,
                    index=index,
                )
            dataset, entry = make_entry(coordinates)
            try:
                value = float(dataset.score_answer(self.answer(completion), entry))
            except Exception:  # noqa: BLE001 - the task could not read the answer: a wrong answer
                value = 0.0
            scores.append(value)
        return scores
