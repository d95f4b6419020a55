"""Where the policy comes from: a user's local Hugging Face model, or the built-in tiny one."""

from __future__ import annotations

from pathlib import Path

from polyrl.platform.config import ConfigError, ModelConfig


def resolve_policy_path(model: ModelConfig) -> Path:
    """A local model directory for ``model``; builds (or reuses the cached) tiny warm policy."""
    if model.path:
        path = Path(model.path).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.path: {str(path)!r} is not a Hugging Face model directory (no config.json)")
        return path
    from polyrl.modalities.warmup import build_warm_policy

    return build_warm_policy(
        model.cache_dir,
        size=model.builtin.size,
        seed=model.builtin.seed,
        steps=model.builtin.warmup_steps,
        lr=model.builtin.warmup_learning_rate,
    )
