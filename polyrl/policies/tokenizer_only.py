"""The policy's tokenizer and positions without its weights, for checks made before a run loads it.

``polyrl validate`` and the start of ``polyrl run`` format the training prompts as the sampler
will and refuse those that leave no position for a response (docs/bad-input.md), which needs the
tokenizer and the model's positions only. They are had cheaply here:

- a ``model.path`` folder: its tokenizer files and ``config.json``;
- a GGUF file (``model.path`` ending in ``.gguf``, or ``model.builtin.name``): the converted folder
  in the model cache, once a run has converted it; before that, the tokenizer the conversion
  will save, read from the file's metadata (:func:`polyrl.policies.pretrained.gguf_tokenizer`),
  and the positions of the file's config;
- a built-in tiny policy: its tokenizer, built in milliseconds by the same function that builds
  the policy's; its positions are the tokenizer's ``model_max_length``, which the tiny policies'
  builders set to their models' ``max_position_embeddings`` (tests/launch/test_preflight_prompts.py
  holds the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyrl.config.schema import ModelConfig
from polyrl.policies.cache import is_complete, resolve_cache_dir
from polyrl.policies.pretrained import file_sha256, gguf_cache_key, gguf_tokenizer, is_gguf_path, packaged_gguf

__all__ = ["PolicyTokenizer", "policy_tokenizer"]


@dataclass(frozen=True)
class PolicyTokenizer:
    tokenizer: Any
    folder: Path | None  # the model folder whose config.json declares the positions (None: a built-in tiny policy)
    positions: int | None  # the positions when there is no folder to read them from
    name: str  # the policy in words, for messages


def _folder(folder: Path, name: str) -> PolicyTokenizer:
    from transformers import AutoTokenizer

    return PolicyTokenizer(AutoTokenizer.from_pretrained(str(folder)), folder, None, name)


def _converted(path: Path, cache_dir: str | Path | None) -> Path | None:
    # The key hashes the file's content, as converted_gguf_dir does; reading the file costs
    # what the run's own look-up costs.
    folder = resolve_cache_dir(cache_dir) / gguf_cache_key(path, file_sha256(path))
    return folder if is_complete(folder) else None


def _gguf(path: Path, cache_dir: str | Path | None) -> PolicyTokenizer | None:
    if not path.is_file():
        return None  # reported by the model check
    folder = _converted(path, cache_dir)
    if folder is not None:
        return _folder(folder, str(folder))
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        return PolicyTokenizer(gguf_tokenizer(path), None, int(config.max_position_embeddings), str(path))
    except Exception:  # noqa: BLE001 - a file the reader cannot take is the model check's to report, by name
        return None


def policy_tokenizer(model: ModelConfig) -> PolicyTokenizer | None:
    """The policy's tokenizer and positions without loading its weights; None when the policy is
    broken (reported by its own check)."""
    if model.path and is_gguf_path(model.path):
        return _gguf(Path(model.path).expanduser(), model.cache_dir)
    if model.path:
        folder = Path(model.path).expanduser()
        return _folder(folder, str(folder))
    if model.builtin.name is not None:
        return _gguf(packaged_gguf(model.builtin.name), model.cache_dir)
    task = model.builtin.task
    if task == "drawing":
        from polyrl.policies.drawing import build_drawing_tokenizer

        tokenizer = build_drawing_tokenizer()
    elif task in ("vqa", "caption"):
        from polyrl.policies.vlm import build_vlm_tokenizer

        tokenizer = build_vlm_tokenizer()
    else:
        from polyrl.policies.text import build_char_tokenizer

        tokenizer = build_char_tokenizer()
    return PolicyTokenizer(tokenizer, None, int(tokenizer.model_max_length), f"the built-in policy (model.builtin.task {task!r})")
