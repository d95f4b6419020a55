"""What every shipped synthetic task shares: hash-fixed splits and its jsonl files."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPLITS = ("train", "test")


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {list(SPLITS)}")


def hashed_split(key: str, test_buckets: int) -> str:
    """``"test"`` for one in ``test_buckets`` keys, fixed by a hash of ``key`` (seed-independent)."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % test_buckets
    return "test" if bucket == 0 else "train"


def split_path(data_dir: Path, split: str) -> Path:
    check_split(split)
    return data_dir / f"{split}.jsonl"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def rows_to_jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)


def write_splits(
    directory: str | Path, sizes: dict[str, int], seed: int, make_rows: Callable[..., list[dict[str, Any]]]
) -> dict[str, Path]:
    """Write ``make_rows(size, seed=seed, split=split)`` to ``directory/<split>.jsonl`` per split."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, size in sizes.items():
        path = directory / f"{split}.jsonl"
        path.write_text(rows_to_jsonl(make_rows(size, seed=seed, split=split)), encoding="utf-8")
        paths[split] = path
    return paths


def data_version(data_dir: Path) -> str:
    """A short hash of the shipped split files, part of the warm-up cache keys."""
    digest = hashlib.sha256()
    for split in SPLITS:
        digest.update(split_path(data_dir, split).read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class ShippedSplits:
    """A task's shipped jsonl splits: exactly ``make_rows(sizes[split], seed=seed, split=split)``."""

    data_dir: Path
    sizes: dict[str, int]
    seed: int
    make_rows: Callable[..., list[dict[str, Any]]]

    def path(self, split: str) -> Path:
        return split_path(self.data_dir, split)

    def read(self, split: str) -> list[dict[str, Any]]:
        return read_jsonl(self.path(split))

    def write(self, directory: str | Path | None = None) -> dict[str, Path]:
        """Regenerate the splits (into ``directory``, default the shipped folder)."""
        return write_splits(self.data_dir if directory is None else directory, self.sizes, self.seed, self.make_rows)

    def version(self) -> str:
        return data_version(self.data_dir)

    def regenerate(self) -> None:
        """``python -m polyrl.tasks.<task>``: rewrite the shipped files and print where."""
        for split, path in self.write().items():
            print(f"{split}: {path}")
