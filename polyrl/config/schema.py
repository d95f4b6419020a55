"""The experiment schema in one import: every section's config class and the loading functions.

The schema lives in one module per section (``base``, ``model``, ``data``, ``rollout``,
``objective``, ``train``, ``tracking``, ``experiment``, ``dotted_keys``); each section's fields,
defaults and refusals sit together there. This module only re-exports them, so
``from polyrl.config.schema import ExperimentConfig`` keeps working; new settings go into their
section's module.
"""

from __future__ import annotations

from polyrl.config.base import ConfigError, StrictModel, check_safe_name
from polyrl.config.data import DataConfig
from polyrl.config.dotted_keys import deep_merge, expand_dotted, flatten, parse_set_options
from polyrl.config.experiment import ExperimentConfig, load_experiment, read_yaml, resolve_arms, to_yaml
from polyrl.config.model import (
    PRETRAINED_NAMES,
    TINY_POLICY_KEYS,
    VLM_CAPTION_WARMUP_STEPS,
    VLM_TASKS,
    BuiltinModelConfig,
    ModelConfig,
)
from polyrl.config.objective import (
    AdvantageConfig,
    DynamicSamplingConfig,
    ModalitiesConfig,
    ModalityGAEConfig,
    ObjectiveConfig,
    OverlongConfig,
)
from polyrl.config.rollout import RolloutConfig, TruncatedImportanceSamplingConfig
from polyrl.config.tracking import CheckpointConfig, EvalConfig, HealthConfig, TrackingConfig
from polyrl.config.train import TrainConfig, ValueConfig
from polyrl.config.yaml_files import safe_load_unique

__all__ = [
    "AdvantageConfig",
    "BuiltinModelConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "DynamicSamplingConfig",
    "EvalConfig",
    "ExperimentConfig",
    "HealthConfig",
    "ModalitiesConfig",
    "ModalityGAEConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "OverlongConfig",
    "PRETRAINED_NAMES",
    "RolloutConfig",
    "StrictModel",
    "TrackingConfig",
    "TrainConfig",
    "TINY_POLICY_KEYS",
    "TruncatedImportanceSamplingConfig",
    "VLM_CAPTION_WARMUP_STEPS",
    "VLM_TASKS",
    "ValueConfig",
    "check_safe_name",
    "deep_merge",
    "expand_dotted",
    "flatten",
    "load_experiment",
    "parse_set_options",
    "read_yaml",
    "resolve_arms",
    "safe_load_unique",
    "to_yaml",
]
