"""The reward-replay store: what ``polyrl replay`` needs to re-score a run's groups without its policy.

One file per arm, beside the rollout inspector's pages:
``<checkpoint.dir>/<name>/<arm>/inspector/replay.jsonl.gz`` (``tracking.replay_store``). It is a
series of gzip members, one JSON line each, appended as the run goes, so a step costs one
small write and a process killed mid-write loses only that step (:func:`read_store` stops at a
cut member). The first line is the header: the run id, the run's resolved config (its rewards,
weights and advantage settings) and each reward's label and weight. Then one line per step::

    {"step": 3, "groups": [{"g": 0, "prompt": ..., "refs": [...], "fields": {...}, "images": 0,
     "samples": [{"text": ..., "ids": [...], "scores": {"<label>": 0.5, ...}, "finish": "stop",
                  "n": 12, "episode": {...}}]}]}

``scores`` are each reward's raw (unweighted) score, None where it scored nothing; ``n`` the
policy's tokens (an episode's observation tokens left out); ``episode`` only for env: episodes.
Images are not kept (their count is): a reward that reads them cannot be replayed. A step
written twice (a resumed run recomputes the steps after its checkpoint) is read as its last copy.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any, Sequence

STORE_NAME = "replay.jsonl.gz"
STORE_VERSION = 1


def store_path(arm_dir: str | Path) -> Path:
    """Where an arm's store lives: its inspector folder."""
    return Path(arm_dir) / "inspector" / STORE_NAME


def _json_default(value: Any) -> Any:
    return str(value)  # a dataset column that is no JSON value (a date, a numpy scalar) keeps its text


def step_record(
    step: int,
    *,
    samples: Sequence[dict[str, Any]],
    prompts: Sequence[Any],
    reward_parts: dict[str, Sequence[float | None]],
    tokens: Sequence[dict[str, Any]],
    group_ids: Sequence[int],
) -> dict[str, Any]:
    """One step's line from the training loop's step report (plain data): its samples grouped by
    prompt, each with its text, token ids and every reward's raw score."""
    groups: dict[int, dict[str, Any]] = {}
    for i, (sample, prompt, group) in enumerate(zip(samples, prompts, group_ids)):
        if group not in groups:
            groups[group] = {
                "g": int(group),
                "prompt": prompt.prompt,
                "refs": list(prompt.references),
                "fields": dict(prompt.fields),
                "images": len(prompt.images),
                "samples": [],
            }
        row = {
            "text": sample.get("completion", ""),
            "ids": list(tokens[i]["ids"]) if i < len(tokens) else [],
            "scores": {label: values[i] for label, values in reward_parts.items() if i < len(values)},
            "finish": sample.get("finish_reason"),
            "n": sample.get("length"),
        }
        if "episode" in sample:  # the loop's sample rows hold it as JSON text
            row["episode"] = json.loads(sample["episode"])
        groups[group]["samples"].append(row)
    return {"step": int(step), "groups": list(groups.values())}


class ReplayStore:
    """Appends the header and the step records of one arm (:mod:`polyrl.tracking.replay_store`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def start(self, header: dict[str, Any]) -> None:
        """Begin the file with ``header``; a resumed run (same run id) keeps what it has, another run
        replaces a file left by an earlier one that used the same folder."""
        if self.path.is_file():
            old = read_header(self.path)
            if old is not None and old.get("run_id") == header.get("run_id"):
                return
            self.path.unlink()
        self._append({"kind": "header", "version": STORE_VERSION, **header})

    def append(self, record: dict[str, Any]) -> None:
        self._append(record)

    def _append(self, entry: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(entry, default=_json_default, separators=(",", ":")) + "\n"
        with self.path.open("ab") as handle:
            handle.write(gzip.compress(line.encode(), compresslevel=6))


def _lines(path: Path) -> list[str]:
    """The JSON lines of the store's gzip members, in order; a member cut short (a process killed
    while writing it) ends the list."""
    data, lines = path.read_bytes(), []
    while data:
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            text = decompressor.decompress(data)
        except zlib.error:
            break
        if not decompressor.eof:
            break
        lines += text.decode().splitlines()
        data = decompressor.unused_data
    return [line for line in lines if line.strip()]


def read_header(path: str | Path) -> dict[str, Any] | None:
    lines = _lines(Path(path))
    first = json.loads(lines[0]) if lines else None
    return first if first is not None and first.get("kind") == "header" else None


def read_store(path: str | Path) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """``(header, {step: record})`` of a store; the last copy of a step written twice wins."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no replay store at {path}")
    lines = [json.loads(line) for line in _lines(path)]
    if not lines or lines[0].get("kind") != "header":
        raise ValueError(f"{path} is not a replay store (no header line)")
    header, steps = lines[0], {}
    if header.get("version") != STORE_VERSION:
        raise ValueError(f"{path}: replay store version {header.get('version')}; this polyrl reads version {STORE_VERSION}")
    for record in lines[1:]:
        steps[int(record["step"])] = record
    return header, dict(sorted(steps.items()))
