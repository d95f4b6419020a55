"""Prompt datasets through Hugging Face ``datasets``, and a resumable prompt sampler.

``load_prompt_dataset(source, split)`` accepts

* ``"arithmetic"`` — the synthetic task shipped with polyrl (``polyrl/tasks/data/arithmetic``);
* ``"arithmetic_chat"`` — the same problems and splits in chat form: each row's ``messages``
  hold one user question (``polyrl/tasks/arithmetic.py``: ``chat_row``), for chat models;
* ``"arithmetic_chat_free"`` — the same, asked as a bare question (``What is 37 + 48?``) whose
  answer's form and length are the model's (``free_chat_row``);
* ``"word_problems"`` — two-step arithmetic word problems in chat form, answered in free text
  (``polyrl/tasks/word_problems.py``), for chat models;
* ``"drawing"`` — the shipped drawing task (``polyrl/tasks/data/drawing``);
* ``"scenes"`` / ``"scenes_captions"`` — the shipped image tasks, VQA and captioning
  (``polyrl/tasks/scenes.py``);
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

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets

from polyrl.core.types import PromptSample
from polyrl.data import chat, image_rows
from polyrl.data import splits as split_rules
from polyrl.data.errors import DataConfigError  # re-exported: callers import it from here
from polyrl.tasks import arithmetic, drawing, scenes, word_problems

BUILTIN_SOURCES = (
    "arithmetic",
    "arithmetic_chat",
    "arithmetic_chat_free",
    "word_problems",
    "drawing",
    "scenes",
    "scenes_captions",
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
}
_FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


# How much of a .json file (a JSON array, not JSON lines) the cheap first-row check parses.
MAX_JSON_PARSE_BYTES = 64 * 1024 * 1024


def _builder(path: Path, source: str) -> str:
    builder = _FILE_FORMATS.get(path.suffix.lower())
    if builder is None:
        raise DataConfigError(
            f"data source {source!r}: unsupported file type {path.suffix!r}; use one of {sorted(_FILE_FORMATS)}"
        )
    return builder


def _first_text_line(path: Path) -> tuple[int, str] | None:
    """The first non-blank line of a text file and its number; ``None`` for an empty file."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                return number, line
    return None


def _empty_error(source: str, path: Path) -> DataConfigError:
    return DataConfigError(f"data source {source!r}: {path} is empty (no rows)")


def _load_file(path: Path, source: str, split: str) -> datasets.Dataset:
    builder = _builder(path, source)
    # datasets reports an empty file with a blank message; say what is wrong instead.
    if path.stat().st_size == 0 or (builder == "json" and _first_text_line(path) is None):
        raise _empty_error(source, path)
    try:
        return datasets.load_dataset(builder, data_files={split: str(path)}, split=split)
    except Exception as error:  # noqa: BLE001 - datasets raises many types for bad files
        reason = f"{type(error).__name__}: {error}" if str(error).strip() else type(error).__name__
        raise DataConfigError(f"data source {source!r}: could not read {path}: {reason}") from error


def _first_row(path: Path, source: str) -> dict[str, Any] | None:
    """The first row of a local data file, read cheaply; ``None`` when it cannot be had cheaply."""
    builder = _builder(path, source)
    if path.stat().st_size == 0:
        raise _empty_error(source, path)
    if builder == "parquet":
        import pyarrow.parquet as pq

        try:
            metadata = pq.ParquetFile(path).metadata
        except Exception as error:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise DataConfigError(
                f"data source {source!r}: {path} is not a readable parquet file ({type(error).__name__}: {error})"
            ) from None
        if metadata.num_rows == 0:
            raise _empty_error(source, path)
        return {name: None for name in metadata.schema.names}
    try:
        first = _first_text_line(path)
    except UnicodeDecodeError as error:
        raise DataConfigError(f"data source {source!r}: {path} is not UTF-8 text ({error})") from None
    if first is None:
        raise _empty_error(source, path)
    number, line = first
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        if path.suffix.lower() == ".jsonl":
            raise DataConfigError(f"data source {source!r}: {path}, line {number}: not valid JSON ({error})") from None
        if path.stat().st_size > MAX_JSON_PARSE_BYTES:
            return None
        try:  # a .json file may be one JSON array spread over lines
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as whole_error:
            raise DataConfigError(f"data source {source!r}: {path} is not valid JSON ({whole_error})") from None
        if not isinstance(rows, list):
            return None
        if not rows:
            raise _empty_error(source, path) from None
        row = rows[0]
    if not isinstance(row, dict):
        raise DataConfigError(f"data source {source!r}: the first row of {path} is not a JSON object (got {type(row).__name__})")
    return row


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
    path = _split_file(source, split, holdout)
    if path is None:
        return
    row = _first_row(path, source)
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
    path = _resolve_local(source, split)
    row = _first_row(path, source) if path is not None else None
    if row is None or images_field not in row:
        return False
    return path.suffix.lower() == ".parquet" or bool(row[images_field])


def may_have_images(source: str, split: str, *, images_field: str = "images") -> bool:
    """Whether a local data file's rows may carry images: its first row has the image field (even
    empty: a later row may fill it), or a parquet file has the column. Built-in tasks (their images
    ship with polyrl and are checked by its tests) and dataset names: ``False``."""
    if source in BUILTIN_SOURCES:
        return False
    path = _resolve_local(source, split)
    row = _first_row(path, source) if path is not None else None
    return row is not None and images_field in row


def _split_file(source: str, split: str, holdout: float | None, whole_file: bool = False) -> Path | None:
    """The local file of ``split`` (:func:`_resolve_local`), refused when it cannot honour the
    split (:mod:`polyrl.data.splits`); ``None`` for a dataset name, where ``holdout`` is refused.
    ``whole_file``: a single file is taken whole, whatever ``split`` says (an eval dataset that
    names no split)."""
    path = _resolve_local(source, split)
    if path is None or Path(source).expanduser().is_dir():
        if holdout is not None:
            raise DataConfigError(split_rules.holdout_refusal(source, "a folder of split files" if path else "a dataset name"))
        return path
    refusal = None if whole_file and holdout is None else split_rules.file_split_refusal(path, source, split, holdout)
    if refusal is not None:
        raise DataConfigError(refusal)
    return path


def _resolve_local(source: str, split: str) -> Path | None:
    """The file to load for a local source, ``None`` when ``source`` is not a local path."""
    path = Path(source).expanduser()
    if path.is_dir():
        for suffix in (".jsonl", ".json", ".parquet"):
            candidate = path / f"{split}{suffix}"
            if candidate.is_file():
                return candidate
        raise DataConfigError(
            f"data source {source!r}: directory has no {split}.jsonl, {split}.json or {split}.parquet for split {split!r}"
        )
    if path.is_file():
        return path
    looks_like_path = path.suffix.lower() in _FILE_FORMATS or source.startswith((".", "/", "~")) or "\\" in source
    if looks_like_path:
        raise DataConfigError(f"data source {source!r}: file not found ({path.resolve()})")
    return None


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
    (``rows_to_prompt_samples`` uses the references list, else the answer, else nothing).
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
        dataset = _load_file(module.shipped_path(split), source, split)
        if hasattr(module, "map_row"):  # a source that is another's rows in a new form (arithmetic_chat)
            dataset = dataset.map(module.map_row)
    else:
        local = _split_file(source, split, holdout, whole_file)
        if local is not None:
            dataset = _load_file(local, source, split)
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


def _references(row: Mapping[str, Any], answer_field: str, references_field: str) -> list[str]:
    if references_field in row and row[references_field] is not None:
        value = row[references_field]
        if isinstance(value, str):
            return [value]
        if isinstance(value, Iterable):
            return [str(item) for item in value]
        raise DataConfigError(f"references field {references_field!r} must be a string or a list, got {value!r}")
    if answer_field in row and row[answer_field] is not None:
        return [str(row[answer_field])]
    return []


def rows_to_prompt_samples(
    rows: Iterable[Mapping[str, Any]] | datasets.Dataset,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    references_field: str = "references",
    images_field: str = "images",
    max_image_pixels: int = image_rows.DEFAULT_MAX_IMAGE_PIXELS,
    messages_field: str | None = None,
) -> list[PromptSample]:
    """Dataset rows -> ``PromptSample``s.

    A row without ``prompt_field`` but with ``messages_field`` (when given) is a chat row: its
    prompt is its last user message's text (what rewards see), and the messages stay in
    ``fields`` for :func:`polyrl.data.chat.format_prompts`.

    ``references`` is the ``references_field`` list if present, else ``[answer]``, else ``[]``.
    ``images`` are the ``images_field`` values as RGB PIL images (``data/images.py``).
    ``fields`` holds every column except the prompt, references and images (so ``answer`` and
    ``id`` reach reward modules).
    """
    samples = []
    for index, row in enumerate(rows):
        if prompt_field not in row and messages_field is not None and row.get(messages_field) is not None:
            prompt = chat.last_user_text(row[messages_field], index=index, field=messages_field)
        elif prompt_field not in row:
            raise DataConfigError(f"row {index}: prompt field {prompt_field!r} not found; columns are {sorted(row)}")
        else:
            prompt = row[prompt_field]
        if not isinstance(prompt, str):
            raise DataConfigError(f"row {index}: prompt field {prompt_field!r} must be a string, got {type(prompt).__name__}")
        fields = {key: value for key, value in row.items() if key not in (prompt_field, references_field, images_field)}
        values = image_rows.image_values(row, images_field, index=index)
        samples.append(
            PromptSample(
                prompt=prompt,
                references=_references(row, answer_field, references_field),
                images=[
                    image_rows.open_image(v, index=index, field=images_field, position=i, max_pixels=max_image_pixels)
                    for i, v in enumerate(values)
                ],
                fields=fields,
            )
        )
    return samples


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

    def next_batch(self, num_prompts: int) -> list[PromptSample]:
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
        if int(state["num_samples"]) != len(self.samples):
            raise ValueError(f"sampler state is for {state['num_samples']} prompts but this sampler has {len(self.samples)}")
        if int(state["seed"]) != self.seed:
            raise ValueError(f"sampler state has seed {state['seed']} but this sampler has seed {self.seed}")
        index = int(state["index"])
        if not 0 <= index < len(self.samples):
            raise ValueError(f"sampler state index {index} is out of range for {len(self.samples)} prompts")
        self.epoch, self.index = int(state["epoch"]), index
