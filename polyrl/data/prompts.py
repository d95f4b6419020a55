"""Prompt datasets: which sources there are, the checks that need no loading, and one split
loaded through Hugging Face ``datasets`` and checked. Local files are read by
:mod:`polyrl.data.source_files`; rows become prompt samples in :mod:`polyrl.data.prompt_samples`
and are drawn by :class:`polyrl.data.sampler.PromptSampler`.

``load_prompt_dataset(source, split)`` accepts

* ``"arithmetic"`` — the synthetic task shipped with polyrl (``polyrl/tasks/data/arithmetic``);
* ``"arithmetic_chat"`` — the same problems and splits in chat form: each row's ``messages``
  hold one user question (``polyrl/tasks/arithmetic.py``: ``chat_row``), for chat models;
* ``"arithmetic_chat_free"`` — the same, asked as a bare question (``What is 37 + 48?``) whose
  answer's form and length are the model's (``free_chat_row``);
* ``"word_problems"`` — two-step arithmetic word problems in chat form, answered in free text
  (``polyrl/tasks/word_problems.py``), for chat models;
* ``"calculator"`` / ``"guess_number"`` — the shipped episode tasks for the environments of the
  same names (``polyrl/tasks/calculator.py``, ``polyrl/tasks/guess_number.py``; config ``env:``);
* ``"python_calculator"`` — the word problems asked with a Python tool, for the environment of the
  same name (``polyrl/tasks/python_calculator.py``);
* ``"drawing"`` — the shipped drawing task (``polyrl/tasks/data/drawing``);
* ``"scenes"`` / ``"scenes_captions"`` — the shipped image tasks, VQA and captioning
  (``polyrl/tasks/scenes.py``);
* ``"reasoning_gym:<task>[?param=value&...]"`` — rows made by a reasoning-gym generator, with a
  held-out split no question of which is a training question (:mod:`polyrl.data.reasoning_gym`;
  the ``envs`` extra);
* ``"textarena:<game>[?size=&test_size=&seed=]"`` — one row per seeded game of a TextArena game,
  for the environment ``textarena`` (:mod:`polyrl.data.textarena`; the ``envs`` extra);
* a local ``.jsonl`` / ``.json`` / ``.parquet`` file, which is one split: the one its name
  declares (``rows.test.jsonl``), else ``train``; or, with ``holdout``, split by a fixed hash of
  each row (:mod:`polyrl.data.splits`); any other split is refused;
* a directory holding ``{split}.jsonl``, ``{split}.json`` or ``{split}.parquet``;
* any other string is taken as a dataset name for ``datasets.load_dataset(name, split=split)``
  (the Hub or a local dataset script/cache).

Every failure the user can cause (missing file, unknown dataset, empty split, missing prompt
field, malformed references) raises ``DataConfigError`` naming the source and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets

from polyrl.data import image_rows, reasoning_gym, textarena
from polyrl.data import splits as split_rules
from polyrl.data.errors import DataConfigError  # re-exported: callers import it from here
from polyrl.data.source_files import first_row, load_file, resolve_local, split_file
from polyrl.tasks import arithmetic, calculator, drawing, guess_number, python_calculator, scenes, word_problems

BUILTIN_SOURCES = (
    "arithmetic",
    "arithmetic_chat",
    "arithmetic_chat_free",
    "word_problems",
    "drawing",
    "scenes",
    "scenes_captions",
    "calculator",
    "guess_number",
    "python_calculator",
)
# The module of each built-in source: its SPLITS and shipped_path(split) (and map_row(row) for a
# source in chat form: the shipped rows, mapped).
_BUILTIN_MODULES = {
    "arithmetic": arithmetic,
    "arithmetic_chat": arithmetic.CHAT,
    "arithmetic_chat_free": arithmetic.CHAT_FREE,
    "word_problems": word_problems,
    "drawing": drawing,
    "scenes": scenes,
    "scenes_captions": scenes.CAPTIONS,
    "calculator": calculator,  # episodes with env: calculator (polyrl/envs)
    "guess_number": guess_number,  # episodes with env: guess_number
    "python_calculator": python_calculator,  # episodes with env: python_calculator (word_problems' rows, mapped)
}


def check_prompt_source(
    source: str, split: str, *, prompt_field: str = "prompt", holdout: float | None = None, messages_field: str | None = None
) -> None:
    """What can be checked about a data source without loading it: a local file exists, is
    not empty, can give ``split``, and its first row has ``prompt_field`` (or ``messages_field``,
    when given: chat rows, :mod:`polyrl.data.chat`). Dataset names are left to the loader."""
    if not isinstance(source, str) or not source:
        raise DataConfigError(f"data source must be a non-empty string, got {source!r}")
    if source in BUILTIN_SOURCES:
        if holdout is not None:
            raise DataConfigError(split_rules.holdout_refusal(source, "a built-in task"))
        splits = _BUILTIN_MODULES[source].SPLITS
        if split not in splits:
            raise DataConfigError(f"data source {source!r}: unknown split {split!r}; allowed: {list(splits)}")
        return
    if reasoning_gym.is_reasoning_gym(source):
        if holdout is not None:
            raise DataConfigError(split_rules.holdout_refusal(source, "a reasoning-gym generator"))
        reasoning_gym.check_split(source, split)
        return
    if textarena.is_textarena(source):
        if holdout is not None:
            raise DataConfigError(split_rules.holdout_refusal(source, "a TextArena game"))
        textarena.check_split(source, split)
        return
    path = split_file(source, split, holdout)
    if path is None:
        return
    row = first_row(path, source)
    if row is not None and prompt_field not in row and (messages_field is None or messages_field not in row):
        raise DataConfigError(
            f"data source {source!r}: prompt field {prompt_field!r}{_or_messages(messages_field)} not found in the first row of {path}; "
            f"fields are {sorted(row)}"
        )


def _or_messages(messages_field: str | None) -> str:
    return "" if messages_field is None else f" (or messages field {messages_field!r})"


IMAGE_SOURCES = ("scenes", "scenes_captions")


def source_has_images(source: str, split: str, *, images_field: str = "images") -> bool:
    """Whether a source's rows carry images, from what is cheap to read: a built-in image task,
    or the first row of a local file (a parquet file: whether the column exists). Dataset names
    (the Hub) are not looked at: ``False``."""
    if source in BUILTIN_SOURCES:
        return source in IMAGE_SOURCES
    path = resolve_local(source, split)
    row = first_row(path, source) if path is not None else None
    if row is None or images_field not in row:
        return False
    return path.suffix.lower() == ".parquet" or bool(row[images_field])


def may_have_images(source: str, split: str, *, images_field: str = "images") -> bool:
    """Whether a local data file's rows may carry images: its first row has the image field (even
    empty: a later row may fill it), or a parquet file has the column. Built-in tasks (their images
    ship with polyrl and are checked by its tests) and dataset names: ``False``."""
    if source in BUILTIN_SOURCES:
        return False
    path = resolve_local(source, split)
    row = first_row(path, source) if path is not None else None
    return row is not None and images_field in row


def load_prompt_dataset(
    source: str,
    split: str,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    references_field: str = "references",
    images_field: str = "images",
    limit: int | None = None,
    holdout: float | None = None,
    whole_file: bool = False,
    images: image_rows.ImageCheck | None = None,
    messages_field: str | None = None,
) -> datasets.Dataset:
    """Load one split of a prompt dataset and check that it is usable.

    The prompt column must exist; ``answer_field`` and ``references_field`` are optional
    (:func:`~polyrl.data.prompt_samples.rows_to_prompt_samples` uses the references list, else the answer, else nothing).
    ``images_field`` is the optional image column (``polyrl/data/image_rows.py``): every row's
    images are checked here (type, file, readable, one ``<image>`` per image) and relative
    image paths become absolute (relative to the data file's folder).
    ``limit`` keeps the first ``limit`` rows. ``holdout`` (a fraction in (0, 1)) splits a single
    local file into ``train`` and ``test`` by a fixed hash of each row (:mod:`polyrl.data.splits`);
    ``whole_file`` takes a single local file whole whatever ``split`` is (an eval dataset that
    names no split), where otherwise a split the file cannot honour is refused. ``images`` sets
    how images are checked (pixel limit, decoding) and counts what was checked.
    ``messages_field`` (chat rows, :mod:`polyrl.data.chat`): a column that may stand in for the
    prompt column.
    """
    if not isinstance(source, str) or not source:
        raise DataConfigError(f"data source must be a non-empty string, got {source!r}")
    if limit is not None and limit <= 0:
        raise DataConfigError(f"data source {source!r}: limit must be positive, got {limit}")

    if holdout is not None and not 0 < holdout < 1:
        raise DataConfigError(f"data source {source!r}: holdout must be a fraction between 0 and 1, got {holdout}")
    local: Path | None = None
    if source in BUILTIN_SOURCES:
        if holdout is not None:
            raise DataConfigError(split_rules.holdout_refusal(source, "a built-in task"))
        module = _BUILTIN_MODULES[source]
        if split not in module.SPLITS:
            raise DataConfigError(f"data source {source!r}: unknown split {split!r}; allowed: {list(module.SPLITS)}")
        dataset = load_file(module.shipped_path(split), source, split)
        if hasattr(module, "map_row"):  # a source that is another's rows in a new form (arithmetic_chat)
            dataset = dataset.map(module.map_row)
    elif reasoning_gym.is_reasoning_gym(source):
        if holdout is not None:
            raise DataConfigError(split_rules.holdout_refusal(source, "a reasoning-gym generator"))
        dataset = reasoning_gym.load_split(source, split)
    elif textarena.is_textarena(source):
        if holdout is not None:
            raise DataConfigError(split_rules.holdout_refusal(source, "a TextArena game"))
        dataset = textarena.load_split(source, split)
    else:
        local = split_file(source, split, holdout, whole_file)
        if local is not None:
            dataset = load_file(local, source, split)
            if holdout is not None:
                if prompt_field not in dataset.column_names:
                    raise DataConfigError(
                        f"data source {source!r}: prompt field {prompt_field!r} not found; columns are {dataset.column_names}"
                    )
                dataset = split_rules.holdout_rows(dataset, split, holdout, prompt_field, images_field)
        else:
            try:
                dataset = datasets.load_dataset(source, split=split)
            except Exception as error:  # noqa: BLE001 - hub, network and script errors vary
                raise DataConfigError(
                    f"data source {source!r}: not a built-in source ({', '.join(BUILTIN_SOURCES)}), "
                    f"not a local file or directory, and datasets.load_dataset({source!r}, split={split!r}) "
                    f"failed: {type(error).__name__}: {error}"
                ) from error
            if isinstance(dataset, datasets.DatasetDict):  # defensive: some loaders ignore split
                dataset = dataset[split]

    if len(dataset) == 0:
        raise DataConfigError(f"data source {source!r}: split {split!r} is empty")
    if prompt_field not in dataset.column_names and (messages_field is None or messages_field not in dataset.column_names):
        raise DataConfigError(
            f"data source {source!r}: prompt field {prompt_field!r}{_or_messages(messages_field)} not found in split {split!r}; "
            f"columns are {dataset.column_names}"
        )
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return _checked_images(dataset, source, local, prompt_field, images_field, images or image_rows.ImageCheck())


def _checked_images(
    dataset: datasets.Dataset, source: str, local: Path | None, prompt_field: str, images_field: str, check: image_rows.ImageCheck
) -> datasets.Dataset:
    """Check every row's images before any model is built (see ``data/images.py``)."""
    if images_field not in dataset.column_names:
        for index, prompt in enumerate(dataset[prompt_field] if prompt_field in dataset.column_names else []):
            if isinstance(prompt, str) and image_rows.IMAGE_PLACEHOLDER in prompt:
                image_rows.check_placeholder_count(prompt, 0, index=index, prompt_field=prompt_field, images_field=images_field)
        return dataset
    base_dir = local.parent if local is not None else None
    feature = dataset.features[images_field]
    inner = getattr(feature, "feature", feature)
    # Check encoded bytes/paths without decoding every image.
    raw = (
        dataset.cast_column(images_field, datasets.List(datasets.Image(decode=False)))
        if isinstance(inner, datasets.Image) and feature is not inner
        else (dataset.cast_column(images_field, datasets.Image(decode=False)) if isinstance(feature, datasets.Image) else dataset)
    )
    image_rows.check_rows(raw, prompt_field=prompt_field, images_field=images_field, base_dir=base_dir, check=check)
    if base_dir is None or isinstance(inner, datasets.Image):
        return dataset

    def absolute(row: dict[str, Any]) -> dict[str, Any]:
        values = row[images_field]
        if isinstance(values, str):
            values = [values]
        return {
            images_field: None if values is None else [str((base_dir / v).resolve()) if isinstance(v, str) else v for v in values]
        }

    return dataset.map(absolute)
