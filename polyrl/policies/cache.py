"""Model folders built once per key and cached: a build writes into a temporary sibling folder,
which is marked complete and only then published under its key, so a crashed or concurrent
build never leaves a half-written model that a later call would return."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polyrl.core.folders import replace_dir

INFO_FILE = "polyrl_warmup.json"  # the build record beside the weights
COMPLETE_MARKER = ".polyrl_complete"


def default_cache_dir() -> Path:
    """``$POLYRL_CACHE`` if set, else ``~/.cache/polyrl/models``."""
    env = os.environ.get("POLYRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "polyrl" / "models"


def resolve_cache_dir(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def cache_key(prefix: str, settings: dict[str, Any]) -> str:
    """``<prefix>-<size>-s<seed>-<hash of all settings>``: one folder per build recipe."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return f"{prefix}-{settings['size']}-s{settings['seed']}-{digest}"


def build_record(settings: dict[str, Any], *, key: str, params: int, started: float, train_seconds: float) -> dict[str, Any]:
    """The fields every build record starts with: the recipe, the key, the size and the timings
    (``started``: the build's ``time.perf_counter()`` start)."""
    return {
        **settings,
        "key": key,
        "params": params,
        "train_seconds": round(train_seconds, 2),
        "total_seconds": round(time.perf_counter() - started, 2),
    }


def held_out_examples(rows: list[dict[str, Any]], greedy: list[str], sampled: list[str], count: int = 8) -> list[dict[str, Any]]:
    """The first ``count`` held-out rows with the greedy and the sampled completion, for the record."""
    return [
        {"prompt": row["prompt"], "answer": row["answer"], "greedy": g, "sampled": s}
        for row, g, s in list(zip(rows, greedy, sampled))[:count]
    ]


def is_complete(directory: Path) -> bool:
    """A published build: marker, build record, config and weights."""
    return (
        (directory / COMPLETE_MARKER).is_file()
        and (directory / INFO_FILE).is_file()
        and (directory / "config.json").is_file()
        and any(directory.glob("*.safetensors"))
    )


def build_cached(final: Path, write: Callable[[Path], dict[str, Any]], *, force: bool = False) -> Path:
    """Publish ``write``'s build at ``final``: ``write(folder)`` writes the model files into a
    fresh temporary folder and returns the build record (saved as :data:`INFO_FILE`).

    A complete folder already at ``final`` is replaced only with ``force``; one that appears
    meanwhile is a concurrent build of the same key (the same result) and is kept.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.parent / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        temporary.mkdir()
        info = write(temporary)
        (temporary / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        (temporary / COMPLETE_MARKER).write_text(final.name + "\n")
        if force or not is_complete(final):
            try:
                replace_dir(temporary, final)
            except OSError:
                if not is_complete(final):
                    raise
    finally:
        if temporary.exists():
            shutil.rmtree(temporary, ignore_errors=True)
    return final
