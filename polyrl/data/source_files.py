"""Local prompt files: which file a source and split name (a file, or a folder of split files),
whether that file can honour the split, its first row read cheaply (for checks before any
loading), and the whole file read through ``datasets`` with errors that name the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

from polyrl.data import splits as split_rules
from polyrl.data.errors import DataConfigError

__all__ = ["FILE_FORMATS", "MAX_JSON_PARSE_BYTES", "first_row", "load_file", "resolve_local", "split_file"]

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}

# How much of a .json file (a JSON array, not JSON lines) the cheap first-row check parses.
MAX_JSON_PARSE_BYTES = 64 * 1024 * 1024


def _builder(path: Path, source: str) -> str:
    builder = FILE_FORMATS.get(path.suffix.lower())
    if builder is None:
        raise DataConfigError(f"data source {source!r}: unsupported file type {path.suffix!r}; use one of {sorted(FILE_FORMATS)}")
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


def load_file(path: Path, source: str, split: str) -> datasets.Dataset:
    builder = _builder(path, source)
    # datasets reports an empty file with a blank message; say what is wrong instead.
    if path.stat().st_size == 0 or (builder == "json" and _first_text_line(path) is None):
        raise _empty_error(source, path)
    try:
        return datasets.load_dataset(builder, data_files={split: str(path)}, split=split)
    except Exception as error:  # noqa: BLE001 - datasets raises many types for bad files
        reason = f"{type(error).__name__}: {error}" if str(error).strip() else type(error).__name__
        raise DataConfigError(f"data source {source!r}: could not read {path}: {reason}") from error


def first_row(path: Path, source: str) -> dict[str, Any] | None:
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


def split_file(source: str, split: str, holdout: float | None, whole_file: bool = False) -> Path | None:
    """The local file of ``split`` (:func:`resolve_local`), refused when it cannot honour the
    split (:mod:`polyrl.data.splits`); ``None`` for a dataset name, where ``holdout`` is refused.
    ``whole_file``: a single file is taken whole, whatever ``split`` says (an eval dataset that
    names no split)."""
    path = resolve_local(source, split)
    if path is None or Path(source).expanduser().is_dir():
        if holdout is not None:
            raise DataConfigError(split_rules.holdout_refusal(source, "a folder of split files" if path else "a dataset name"))
        return path
    refusal = None if whole_file and holdout is None else split_rules.file_split_refusal(path, source, split, holdout)
    if refusal is not None:
        raise DataConfigError(refusal)
    return path


def resolve_local(source: str, split: str) -> Path | None:
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
    looks_like_path = path.suffix.lower() in FILE_FORMATS or source.startswith((".", "/", "~")) or "\\" in source
    if looks_like_path:
        raise DataConfigError(f"data source {source!r}: file not found ({path.resolve()})")
    return None
