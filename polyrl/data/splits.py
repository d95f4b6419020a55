"""Which rows a split is, and whether held-out rows repeat training rows.

A source honours a split in one of three ways:

* a built-in task or a folder: its own split files (``<folder>/{split}.jsonl`` …);
* a single file: the file *is* one split. Its name may declare which (``test.jsonl``,
  ``rows.test.jsonl``, ``rows_test.jsonl``, ``rows-test.jsonl``); a file whose name declares
  none is the ``train`` split only. Any other split is refused, naming the ways out: before,
  ``{source: rows.jsonl, split: test}`` evaluated on the training rows without a word;
* a single file with a declared hold-out fraction (``holdout: 0.1``): a row is ``test`` when a
  fixed hash of its content (prompt text and image values) falls in that fraction, else
  ``train``; the same rows, whatever the seed, and a row's duplicates always share its split.

:func:`overlap_count` counts the rows of one set of prompts that repeat another's (prompt text
and image pixels), which periodic evaluation reports when an eval suite overlaps training.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import datasets

# Words a file name may end in to declare its split (after '.', '_' or '-', or as the whole stem).
SPLIT_WORDS = ("train", "test", "validation", "valid", "val", "dev", "eval", "heldout", "holdout")
HOLDOUT_SPLITS = ("train", "test")


def declared_split(path: Path) -> str | None:
    """The split a data file's name declares (``rows.test.jsonl`` → ``"test"``), else ``None``."""
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    lowered = stem.lower()
    for word in sorted(SPLIT_WORDS, key=len, reverse=True):
        if lowered == word or lowered.endswith((f".{word}", f"_{word}", f"-{word}")):
            return word
    return None


def file_split_refusal(path: Path, source: str, split: str, holdout: float | None) -> str | None:
    """Why one local file cannot give ``split`` (``None`` when it can)."""
    ways = (
        f"put the rows in a folder beside the other splits' files as {split}{path.suffix}, name the file after its split "
        f"(<name>.{split}{path.suffix}), or declare a hold-out fraction (holdout: 0.1) to split one file by a fixed hash"
    )
    if holdout is not None:
        if split not in HOLDOUT_SPLITS:
            return f"data source {source!r}: with a hold-out fraction a file has the splits {list(HOLDOUT_SPLITS)}, not {split!r}"
        if declared_split(path) not in (None, "train"):
            return (
                f"data source {source!r}: {path.name} is named as the {declared_split(path)!r} split; a hold-out fraction "
                "splits a training file, not one already held out"
            )
        return None
    declared = declared_split(path) or "train"
    if declared != split:
        named = f"is named as the {declared!r} split" if declared_split(path) else "is one file, which is the 'train' split only"
        return f"data source {source!r}: {path.name} {named}, so it has no split {split!r}; {ways}"
    return None


def holdout_refusal(source: str, kind: str) -> str:
    return (
        f"data source {source!r}: holdout splits a single local file by a fixed hash; this source is {kind}, whose splits "
        "are its own (remove holdout)"
    )


def _content_digest(parts: Iterable[Any]) -> bytes:
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, (bytes, bytearray)):
            digest.update(bytes(part))
        else:
            digest.update(json.dumps(part, sort_keys=True, default=str).encode())
        digest.update(b"\x00")
    return digest.digest()


def _image_parts(value: Any) -> list[Any]:
    """An undecoded image column value (a path, ``{"bytes", "path"}``, or a list of them) as hashable parts."""
    values = value if isinstance(value, list) else [value]
    parts: list[Any] = []
    for item in values:
        if isinstance(item, dict):
            parts.append(item.get("bytes") or item.get("path"))
        else:
            parts.append(item)
    return parts


def holdout_fraction_position(prompt: str, images: Any = None) -> float:
    """A row's fixed place in [0, 1): a hash of its prompt text and image values."""
    digest = _content_digest(["polyrl-holdout", prompt, *_image_parts(images)])
    return int.from_bytes(digest[:8], "big") / 2**64


def holdout_indices(prompts: Sequence[str], images: Sequence[Any] | None, split: str, fraction: float) -> list[int]:
    """The rows of ``split``: ``test`` those whose position is below ``fraction``, ``train`` the rest."""
    wanted_test = split == "test"
    return [
        index
        for index, prompt in enumerate(prompts)
        if (holdout_fraction_position(prompt, None if images is None else images[index]) < fraction) == wanted_test
    ]


def sample_key(sample: Any) -> bytes:
    """What a model sees of a prompt sample: its text and its images' pixels."""
    parts: list[Any] = [sample.prompt]
    for image in getattr(sample, "images", None) or []:
        parts += [image.mode, list(image.size), image.tobytes()]
    return _content_digest(parts)


def overlap_count(held_out: Sequence[Any], training: Sequence[Any]) -> int:
    """How many of ``held_out``'s samples repeat a ``training`` sample (same text, same pixels)."""
    seen = {sample_key(sample) for sample in training}
    return sum(sample_key(sample) in seen for sample in held_out)


def overlap_warning(label: str, held_out: Sequence[Any], training: Sequence[Any]) -> str | None:
    """A warning naming how many eval rows are training rows, or ``None`` when none are."""
    count = overlap_count(held_out, training)
    if not count:
        return None
    return (
        f"eval_overlap: {count} of the {len(held_out)} rows of eval dataset {label!r} are also training rows (same prompt and "
        "images), so its scores partly measure memorisation → evaluate on a split disjoint from data.source's training rows"
    )


def holdout_rows(
    dataset: datasets.Dataset, split: str, fraction: float, prompt_field: str, images_field: str
) -> datasets.Dataset:
    """The rows of ``split`` under a declared hold-out fraction (a fixed hash of each row's content)."""
    images = None
    if images_field in dataset.column_names:
        feature = dataset.features[images_field]
        inner = getattr(feature, "feature", feature)
        raw = dataset
        if isinstance(inner, datasets.Image):  # hash the encoded bytes/paths, not decoded pictures
            raw = dataset.cast_column(
                images_field,
                datasets.List(datasets.Image(decode=False)) if feature is not inner else datasets.Image(decode=False),
            )
        images = raw[images_field]
    return dataset.select(holdout_indices(dataset[prompt_field], images, split, fraction))
