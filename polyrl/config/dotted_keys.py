"""Dotted keys both ways: ``--set a.b=c`` and arm overrides into nested mappings, merged over a
base; and a nested config flattened into dotted keys (MLflow params)."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from polyrl.config.base import ConfigError


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def expand_dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    """``{"objective.name": "dr_grpo"}`` → ``{"objective": {"name": "dr_grpo"}}`` (nested dicts kept)."""
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        value = expand_dotted(value) if isinstance(value, dict) else value
        parts = str(key).split(".")
        target = nested
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        if isinstance(value, dict) and isinstance(target.get(parts[-1]), dict):
            target[parts[-1]] = deep_merge(target[parts[-1]], value)
        else:
            target[parts[-1]] = value
    return nested


def parse_set_options(assignments: list[str]) -> dict[str, Any]:
    """``--set a.b=c`` options; values are parsed as YAML scalars (``3`` → int, ``true`` → bool)."""
    overrides: dict[str, Any] = {}
    for assignment in assignments:
        if "=" not in assignment:
            raise ConfigError(f"--set {assignment!r}: expected KEY.PATH=VALUE")
        key, raw = assignment.split("=", 1)
        overrides[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
    return expand_dotted(overrides)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested config into dotted keys for MLflow params."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, path + "."))
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            for index, item in enumerate(value):
                flat.update(flatten(item, f"{path}.{index}."))
        else:
            flat[path] = value
    return flat
