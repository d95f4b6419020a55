"""Where the policy comes from: a user's local Hugging Face model folder or GGUF file, a
packaged pretrained model, or the built-in tiny one."""

from __future__ import annotations

import json
from pathlib import Path

from polyrl.config.schema import ConfigError, ModelConfig
from polyrl.policies.pretrained import check_gguf_file, converted_gguf_dir, is_gguf_path, pretrained_dir

# What transformers' AutoTokenizer and from_pretrained (and vLLM) read from a model folder.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def check_model_dir(path: str | Path, *, field: str = "model.path") -> Path:
    """``path`` if it holds a loadable Hugging Face model (config, tokenizer, weights), else a
    :class:`ConfigError` naming each missing part — checked from file names, before any load.
    A ``.gguf`` path is checked as a GGUF file instead (it is converted when the run starts)."""
    if is_gguf_path(path):
        return check_gguf_file(path, field=field)
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{field}: {str(path)!r} is not a folder")
    config = path / "config.json"
    if not config.is_file():
        raise ConfigError(f"{field}: {str(path)!r} is not a Hugging Face model directory (no config.json)")
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{field}: {config} is not valid JSON ({error})") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"{field}: {config} must hold a JSON object, got {type(parsed).__name__}")
    problems = []
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    weights = [path / name for name in WEIGHT_FILES if (path / name).is_file()]
    if not weights:
        problems.append(f"no weights (none of {', '.join(WEIGHT_FILES)})")
    for index in (w for w in weights if w.name.endswith(".index.json")):
        problems.extend(_missing_shards(index))
    if problems:
        raise ConfigError(
            f"{field}: {str(path)!r} is not a usable model folder: "
            + "; ".join(problems)
            + " (save_pretrained of a model and its tokenizer writes them all)"
        )
    return path


def _missing_shards(index: Path) -> list[str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
        return [f"{index.name} is not a valid weight index ({type(error).__name__}: {error})"]
    missing = [name for name in shards if not (index.parent / name).is_file()]
    return [f"{index.name} lists missing shard(s) {', '.join(missing)}"] if missing else []


def resolve_policy_path(model: ModelConfig) -> Path:
    """A local model directory for ``model``: its folder, its GGUF file converted (cached), the
    packaged pretrained model converted (cached), or the tiny warm policy built (cached)."""
    if model.path and is_gguf_path(model.path):
        return converted_gguf_dir(model.path, model.cache_dir)
    if model.path:
        return check_model_dir(model.path)
    if model.builtin.name is not None:
        return pretrained_dir(model.builtin.name, model.cache_dir)
    if model.builtin.task == "drawing":
        from polyrl.policies.drawing import build_drawing_policy

        return build_drawing_policy(
            model.cache_dir,
            size=model.builtin.size,
            seed=model.builtin.seed,
            steps=model.builtin.warmup_steps,
            lr=model.builtin.warmup_learning_rate,
        )
    if model.builtin.task in ("vqa", "caption"):
        from polyrl.policies.vlm import warm_vlm_policy

        return warm_vlm_policy(
            model.cache_dir,
            task=model.builtin.task,
            size=model.builtin.size,
            seed=model.builtin.seed,
            steps=model.builtin.warmup_steps,
            lr=model.builtin.warmup_learning_rate,
        )
    from polyrl.policies.warmup import build_warm_policy

    return build_warm_policy(
        model.cache_dir,
        size=model.builtin.size,
        seed=model.builtin.seed,
        steps=model.builtin.warmup_steps,
        lr=model.builtin.warmup_learning_rate,
    )
