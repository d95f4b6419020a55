"""Data source ``reasoning_gym:<task>[?param=value&...]``: rows made by a reasoning-gym generator.

reasoning-gym (arXiv 2505.24760) ships ~100 procedural tasks (``basic_arithmetic``,
``chain_sum``, ``countdown``, ``sudoku`` ...), each a generator with a config dataclass; item
``i`` of a generator seeded ``s`` is drawn with ``Random(s + i)``, so a row is fixed by
``(task, config, index)``.

* ``train`` is items ``0 .. size-1`` of the generator seeded ``seed``;
* ``test`` is drawn by a generator seeded ``seed + HELD_OUT_SEED_OFFSET`` (random streams that
  never meet the training ones), skipping every item whose question is also a training question,
  until ``test_size`` are found: no held-out question is ever trained on.

Query parameters are the generator's config fields (``reasoning_gym:basic_arithmetic?min_terms=2&
max_terms=3``; ``seed`` defaults to 0 and ``size``, the training rows, to the generator's own
default), converted to the type of the field's default (a list or tuple as JSON, ``[1,3]``),
plus polyrl's own: ``test_size`` (held-out rows, default 200) and ``answer_format`` (``tags``,
the default: the prompt ends by asking for ``<answer>...</answer>``, which the ``reasoning_gym``
reward reads; ``none``: the bare question).

Each row: ``prompt``, ``question``, ``answer`` (the generator's), ``id``, ``split`` and
``reasoning_gym`` (the item's coordinates, which the reward module
:mod:`polyrl.rewards.builtins.reasoning_gym` scores with).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import datasets

from polyrl.data.errors import DataConfigError
from polyrl.data.source_params import did_you_mean, source_params
from polyrl.rewards.base import RewardConfigError
from polyrl.rewards.builtins.reasoning_gym import entry_coordinates, import_reasoning_gym

PREFIX = "reasoning_gym:"
SPLITS = ("train", "test")
HELD_OUT_SEED_OFFSET = 1_000_000_007  # a prime far past any training size: disjoint Random(seed + i) streams
DEFAULT_SEED = 0
DEFAULT_TEST_SIZE = 200
# How far the held-out generator may be grown (size doubled each time) to find test_size items
# whose questions are not training questions.
MAX_HELD_OUT_GROWTH = 8
ANSWER_FORMATS = ("tags", "none")
ANSWER_INSTRUCTION = "Give your final answer between <answer> and </answer>."
POLYRL_PARAMS = ("test_size", "answer_format")

__all__ = ["PREFIX", "SPLITS", "ReasoningGymSource", "is_reasoning_gym", "load_split", "parse_source"]


def is_reasoning_gym(source: str) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


@dataclasses.dataclass(frozen=True)
class ReasoningGymSource:
    """A parsed ``reasoning_gym:`` source: the task, its generator config (seed and size
    included, typed) and polyrl's own settings."""

    source: str
    task: str
    config: tuple[tuple[str, Any], ...]  # sorted (field, value): hashable, for the caches
    test_size: int
    answer_format: str

    @property
    def train_config(self) -> dict[str, Any]:
        return dict(self.config)

    def held_out_config(self, growth: int = 1) -> dict[str, Any]:
        config = dict(self.config)
        config["seed"] = int(config["seed"]) + HELD_OUT_SEED_OFFSET
        config["size"] = self.test_size * growth
        return config


def _reasoning_gym(source: str) -> Any:
    try:
        return import_reasoning_gym(f"data source {source!r}")
    except RewardConfigError as error:
        raise DataConfigError(str(error)) from None


def _field_defaults(config_cls: type) -> dict[str, Any]:
    defaults = {}
    for field in dataclasses.fields(config_cls):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
        else:
            defaults[field.name] = None
    return defaults


def _accepted(defaults: dict[str, Any]) -> str:
    own = [f"{name}" for name in POLYRL_PARAMS]
    return ", ".join([f"{name} (default {value!r})" for name, value in defaults.items()] + own)


def _convert(source: str, name: str, raw: str, default: Any, defaults: dict[str, Any]) -> Any:
    """A query value as the type of the field's default (JSON for lists, tuples and fields whose default is None)."""
    want = type(default)
    try:
        if isinstance(default, bool):
            lowered = raw.strip().lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError("expected true or false")
            return lowered in ("true", "1")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, str):
            return raw
        if default is None:
            try:
                return json.loads(raw)
            except json.JSONDecodeError:
                return raw
        value = json.loads(raw)
        if isinstance(default, tuple) and isinstance(value, list):
            return tuple(value)
        if not isinstance(value, want):
            raise ValueError(f"expected a {want.__name__} as JSON")
        return value
    except ValueError as error:
        article = "an" if want.__name__[0] in "aeiou" else "a"
        raise DataConfigError(
            f"data source {source!r}: param {name}={raw!r} is not {article} {want.__name__} (its default is {default!r}): {error}; "
            f"the generator accepts: {_accepted(defaults)}"
        ) from None


@functools.lru_cache(maxsize=64)
def parse_source(source: str) -> ReasoningGymSource:
    """Parse and check ``reasoning_gym:<task>?...``: the task exists, every param is one the
    generator (or polyrl) accepts and of the right type, and the generator's own ``validate``
    accepts the values. Generates nothing."""
    if not is_reasoning_gym(source):
        raise DataConfigError(f"data source {source!r} is not a reasoning_gym:<task> source")
    task, _, query = source[len(PREFIX) :].partition("?")
    task = task.strip()
    rg = _reasoning_gym(source)
    from reasoning_gym.factory import DATASETS

    names = sorted(name for name in DATASETS if name != "composite")  # composite mixes other tasks by a config of configs
    if task not in names:
        close = did_you_mean(task, names)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise DataConfigError(
            f"data source {source!r}: reasoning-gym has no task {task!r}; {hint}allowed tasks ({len(names)}): {', '.join(names)}"
        )
    pairs = source_params(source, query)
    names_given = [name for name, _ in pairs]
    repeated = sorted({name for name in names_given if names_given.count(name) > 1})
    if repeated:
        raise DataConfigError(f"data source {source!r}: param(s) {repeated} given more than once")
    defaults = _field_defaults(DATASETS[task][1])
    config: dict[str, Any] = {}
    test_size, answer_format = DEFAULT_TEST_SIZE, "tags"
    for name, raw in pairs:
        if name == "test_size":
            test_size = _convert(source, name, raw, DEFAULT_TEST_SIZE, defaults)
            if test_size < 1:
                raise DataConfigError(f"data source {source!r}: test_size must be at least 1, got {test_size}")
        elif name == "answer_format":
            if raw not in ANSWER_FORMATS:
                raise DataConfigError(f"data source {source!r}: answer_format {raw!r} is not one of {list(ANSWER_FORMATS)}")
            answer_format = raw
        elif name not in defaults:
            close = did_you_mean(name, list(defaults) + list(POLYRL_PARAMS), most=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise DataConfigError(
                f"data source {source!r}: task {task!r} has no param {name!r}{hint}; the generator accepts: {_accepted(defaults)}"
            )
        else:
            config[name] = _convert(source, name, raw, defaults[name], defaults)
    config.setdefault("seed", DEFAULT_SEED if defaults.get("seed") is None else defaults["seed"])
    config.setdefault("size", defaults.get("size") or 500)
    if int(config["size"]) < 1:
        raise DataConfigError(f"data source {source!r}: size (the training rows) must be at least 1, got {config['size']}")
    try:
        rg.create_dataset(task, **{**config, "size": 1})  # the generator's own validate() on these values
    except Exception as error:  # noqa: BLE001 - reasoning-gym reports bad values as AssertionError or ValueError
        reason = str(error) or type(error).__name__
        raise DataConfigError(
            f"data source {source!r}: the {task!r} generator refuses these params {config}: {reason}; "
            f"it accepts: {_accepted(defaults)}"
        ) from None
    return ReasoningGymSource(source, task, tuple(sorted(config.items())), int(test_size), answer_format)


def _row(
    spec: ReasoningGymSource, config: dict[str, Any], index: int, item: dict[str, Any], split: str, number: int
) -> dict[str, Any]:
    question = str(item["question"])
    prompt = question if spec.answer_format == "none" else f"{question.rstrip()}\n\n{ANSWER_INSTRUCTION}"
    return {
        "prompt": prompt,
        "question": question,
        "answer": None if item.get("answer") is None else str(item["answer"]),
        "id": f"rg-{spec.task}-{split}-{number:05d}",
        "split": split,
        "reasoning_gym": entry_coordinates(spec.task, config, index),
    }


@functools.lru_cache(maxsize=16)
def _rows(spec: ReasoningGymSource, split: str) -> tuple[dict[str, Any], ...]:
    rg = _reasoning_gym(spec.source)
    train_config = spec.train_config
    train = rg.create_dataset(spec.task, **train_config)
    if split == "train":
        return tuple(_row(spec, train_config, i, train[i], split, i) for i in range(len(train)))
    seen = {str(train[i]["question"]) for i in range(len(train))}
    growth, drawn = 1, 0
    while growth <= MAX_HELD_OUT_GROWTH:
        config = spec.held_out_config(growth)
        held_out = rg.create_dataset(spec.task, **config)
        rows, questions = [], set()
        for index in range(len(held_out)):
            item = held_out[index]
            question = str(item["question"])
            if question in seen or question in questions:  # a training question, or one already held out
                continue
            questions.add(question)
            rows.append(_row(spec, config, index, item, split, len(rows)))
            if len(rows) == spec.test_size:
                return tuple(rows)
        drawn, growth = len(held_out), growth * 2
    raise DataConfigError(
        f"data source {spec.source!r}: only {len(rows)} of {drawn} held-out items have a question that is not a training "
        f"question (or another held-out one), short of test_size={spec.test_size}; the task's params leave too few distinct "
        "questions: lower test_size or size, or widen the params"
    )


def check_split(source: str, split: str) -> ReasoningGymSource:
    spec = parse_source(source)
    if split not in SPLITS:
        raise DataConfigError(f"data source {source!r}: unknown split {split!r}; allowed: {list(SPLITS)}")
    return spec


def load_split(source: str, split: str) -> datasets.Dataset:
    """The rows of ``split`` (``train`` or ``test``) as a ``datasets.Dataset``."""
    spec = check_split(source, split)
    return datasets.Dataset.from_list([dict(row) for row in _rows(spec, split)])
