"""The experiment: the whole config with the checks that span sections, and its arms.

YAML is the serialised form of :class:`ExperimentConfig`. A file may hold ``arms:``, named
variants that override keys of the base config; each arm resolves to a complete, validated
config of its own. Every validation error names the field path, the bad value and what is
allowed (see :func:`format_validation_error`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from polyrl.config.base import ConfigError, StrictModel, check_safe_name
from polyrl.config.data import DataConfig
from polyrl.config.distill import DistillConfig, distill_refusals
from polyrl.config.dotted_keys import deep_merge, expand_dotted, parse_set_options
from polyrl.config.episodes import EnvConfig, env_refusals
from polyrl.config.inert_settings import drop_idle, inert_refusals, switched_off_later
from polyrl.config.model import ModelConfig
from polyrl.config.objective import AdvantageConfig, ModalitiesConfig, ObjectiveConfig
from polyrl.config.presets import PRESETS, PresetError, objective_preset_overrides, preset_overrides
from polyrl.config.rollout import RolloutConfig
from polyrl.config.tracking import CheckpointConfig, EvalConfig, HealthConfig, TrackingConfig
from polyrl.config.train import TrainConfig
from polyrl.config.validation_errors import format_validation_error
from polyrl.config.yaml_files import YAMLFileError, safe_load_unique
from polyrl.rewards import RewardSpec


def _refuse(refusals: Iterable[tuple[tuple[Any, ...], str, Any]]) -> None:
    """Raise a section's refusals ``(field path, message, value)`` as one validation error, so each
    is reported at its path with the value given (polyrl.config.validation_errors)."""
    errors = [
        InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=value)
        for loc, message, value in refusals
    ]
    if errors:
        raise ValidationError.from_exception_data("ExperimentConfig", errors)


class ExperimentConfig(StrictModel):
    name: str = Field(
        ...,
        min_length=1,
        description="The experiment's name: it names the checkpoint folder (checkpoint.dir/<name>/<arm>) and the MLflow "
        "runs, and is the default MLflow experiment (tracking.experiment).",
    )
    description: str = Field(
        "",
        description="Free text saying what the experiment asks; logged with the run's params and shown as the "
        "question in the results document.",
    )
    seed: int = Field(
        0,
        description="Seeds Python, NumPy and torch, the prompt sampler's order and the rollout engine's per-request "
        "sampling seeds; the file's seeds: (or --seeds) runs each arm once per seed and sets this for each.",
    )
    preset: Literal["lt_1b", "1b_10b", "gt_10b"] | None = Field(
        None,
        description="A hyper-parameter preset by model size (< 1B, 1–10B, > 10B): the rollout batch, clip width, "
        "text GAE γ/λ and learning rate, applied objective-aware under the keys the YAML writes itself "
        "(polyrl/config/presets.py). polyrl's own starting points, not a published recipe.",
    )
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    objective: ObjectiveConfig = ObjectiveConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    rewards: list[RewardSpec] = Field(default_factory=lambda: [RewardSpec(module="accuracy")])
    modalities: ModalitiesConfig = ModalitiesConfig()
    train: TrainConfig = TrainConfig()
    tracking: TrackingConfig = TrackingConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    eval: EvalConfig = EvalConfig()
    health: HealthConfig = HealthConfig()
    env: EnvConfig | None = Field(
        None,
        description="Train on multi-turn episodes with an environment instead of single completions (section below; "
        "polyrl/config/episodes.py); null: single completions scored by rewards.",
    )
    distill: DistillConfig | None = Field(
        None,
        description="On-policy distillation from a teacher model (section below; polyrl/config/distill.py, "
        "docs/distillation.md); null: no teacher.",
    )

    @property
    def sampling_dtype(self) -> str:
        """The dtype the rollout engine samples in: rollout.dtype, else model.dtype."""
        return self.rollout.dtype or self.model.dtype

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        return check_safe_name(name, "it names folders and MLflow runs")

    @model_validator(mode="after")
    def _typed_params(self) -> "ExperimentConfig":
        """Check objective.params and advantage.params against their registration's typed model
        and store them as proper Python values; errors keep their field paths."""
        from polyrl.algos.advantages import get_advantage
        from polyrl.algos.objectives import get_objective

        objective = get_objective(self.objective.name)
        estimator = get_advantage(self.advantage.estimator or objective.default_advantage)
        errors: list[InitErrorDetails] = []
        for name, section, spec in (("objective", self.objective, objective), ("advantage", self.advantage, estimator)):
            try:
                section.params = spec.validate_params(section.params)
            except ValidationError as error:
                # validate_params reports custom errors (message and ctx['allowed']); re-raise
                # them at their place in the experiment.
                errors += [InitErrorDetails(type=PydanticCustomError(item["type"], item["msg"], item["ctx"]),
                                            loc=(name, "params", *item["loc"]), input=item["input"])
                           for item in error.errors()]  # fmt: skip
        if errors:
            raise ValidationError.from_exception_data("ExperimentConfig", errors)
        return self

    @model_validator(mode="after")
    def _env_applies(self) -> "ExperimentConfig":
        _refuse((loc, message, value) for loc, value, message in env_refusals(self))
        return self

    @model_validator(mode="after")
    def _distill_applies(self) -> "ExperimentConfig":
        """distill against the rest of the config (polyrl.config.distill.distill_refusals)."""
        _refuse(distill_refusals(self))
        return self

    @model_validator(mode="after")
    def _padding_free_applies(self) -> "ExperimentConfig":
        """Padding-free rows and shared prompts pack a micro-batch in two different ways, and a
        compiled decoder layer would recompile for every packed length: an explicit true is refused."""
        t = self.train
        clash = "share_prompts: true" if t.share_prompts else "compile: true" if t.compile else None
        if t.padding_free is True and clash:
            error = PydanticCustomError(
                "value_error",
                "padding_free: true cannot run with {clash}; allowed here: {allowed}",
                {"clash": clash, "allowed": "padding_free: false or auto"},
            )
            raise ValidationError.from_exception_data(
                "ExperimentConfig", [InitErrorDetails(type=error, loc=("train", "padding_free"), input=True)]
            )
        return self

    @model_validator(mode="after")
    def _share_prompts_applies(self) -> "ExperimentConfig":
        """Shared prompts cut micro-batches by prompt groups; a token budget would be ignored."""
        if self.train.share_prompts and self.train.micro_batch_tokens:
            error = PydanticCustomError(
                "value_error",
                "share_prompts keeps each prompt's rows in one micro-batch of "
                "micro_batch_size rows, so micro_batch_tokens would not apply; allowed here: {allowed}",
                {"allowed": "share_prompts: false, or micro_batch_tokens: null"},
            )
            raise ValidationError.from_exception_data(
                "ExperimentConfig", [InitErrorDetails(type=error, loc=("train", "share_prompts"), input=True)]
            )
        return self

    @model_validator(mode="after")
    def _adapter_sync_applies(self) -> "ExperimentConfig":
        """Only vLLM takes a LoRA adapter apart from the weights (the HF engine would need merged ones)."""
        lora = self.model.lora
        if lora is not None and lora.sync == "adapter" and self.rollout.engine != "vllm":
            error = PydanticCustomError(
                "value_error",
                "'adapter' sends the adapter through vLLM's LoRA support, but "
                "rollout.engine is {engine}; allowed here: {allowed}",
                {"engine": repr(self.rollout.engine), "allowed": "'merged', or rollout.engine: vllm"},
            )
            raise ValidationError.from_exception_data(
                "ExperimentConfig", [InitErrorDetails(type=error, loc=("model", "lora", "sync"), input="adapter")]
            )
        return self

    @model_validator(mode="after")
    def _learner_workers_apply(self) -> "ExperimentConfig":
        """Settings the data-parallel learner ranks do not build (never run across ranks here) are refused."""
        t = self.train
        clash = (
            "model.lora"
            if self.model.lora is not None
            else "model.freeze"
            if self.model.freeze is not None
            else "train.compile: true"
            if t.compile
            else "train.share_prompts: true"
            if t.share_prompts
            else None
        )
        if t.learner_workers > 1 and clash:
            error = PydanticCustomError(
                "value_error",
                "learner_workers: {workers} cannot run with {clash} (the learner ranks do not build it); allowed here: {allowed}",
                {"workers": t.learner_workers, "clash": clash, "allowed": f"learner_workers: 1, or no {clash}"},
            )
            raise ValidationError.from_exception_data(
                "ExperimentConfig", [InitErrorDetails(type=error, loc=("train", "learner_workers"), input=t.learner_workers)]
            )
        return self

    @model_validator(mode="after")
    def _rollout_correction_applies(self) -> "ExperimentConfig":
        """objective.rollout_correction against the rollout (polyrl.config.objective.check_rollout_correction)."""
        from polyrl.config.objective import check_rollout_correction

        _refuse(check_rollout_correction(self))
        return self

    @model_validator(mode="after")
    def _reward_aggregation_applies(self) -> "ExperimentConfig":
        """advantage.reward_aggregation against the rewards and the estimator (polyrl.config.objective.check_reward_aggregation)."""
        from polyrl.config.objective import check_reward_aggregation

        _refuse(check_reward_aggregation(self))
        return self

    @model_validator(mode="after")
    def _every_setting_acts(self, info: ValidationInfo) -> "ExperimentConfig":
        """A field written in the YAML that would do nothing here (polyrl.config.inert_settings); the
        context's ``inert_exempt``: fields a later layer (arm, --set) switched off."""
        exempt = (info.context or {}).get("inert_exempt", set())
        _refuse(inert_refusals(self, exempt))
        return self

    @model_validator(mode="after")
    def _cpu_matmul_applies(self) -> "ExperimentConfig":
        """An explicit ``train.cpu_matmul: onednn`` that would silently not run is refused here;
        the device and the torch build are checked when the arm is built."""
        if self.train.cpu_matmul == "onednn" and self.model.dtype != "float32":
            error = PydanticCustomError(
                "value_error",
                "'onednn' is for float32 learners, but {reasons}; allowed here: {allowed}",
                {
                    "reasons": f"model.dtype is {self.model.dtype} (its autocast matmuls already run in oneDNN)",
                    "allowed": "'auto', 'torch'",
                },
            )
            raise ValidationError.from_exception_data(
                "ExperimentConfig", [InitErrorDetails(type=error, loc=("train", "cpu_matmul"), input="onednn")]
            )
        return self


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        data = safe_load_unique(path.read_text(), str(path))
    except YAMLFileError as error:
        raise ConfigError(str(error)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def resolve_arms(
    raw: dict[str, Any], *, source: str = "<config>", overrides: dict[str, Any] | None = None
) -> dict[str, ExperimentConfig]:
    """Validate a raw mapping and return one resolved config per arm (``{"main": cfg}`` without arms).

    Order of precedence, lowest first: schema defaults, preset, base keys, arm keys, ``--set``.
    """
    raw = copy.deepcopy(raw)
    raw.pop("seeds", None)  # the experiment's seed axis, not a run setting: config.seeds reads it
    raw.pop("until_resolved", None)  # the experiment's rounds of seeds: config.until_resolved reads it
    raw.pop("seeds_at_once", None)  # how the seed runs share the machine: config.seeds reads it
    arms_raw = raw.pop("arms", None) or {}
    if not isinstance(arms_raw, dict):
        raise ConfigError(
            f"{source}: invalid experiment config\n  - arms: expected a mapping of arm name to overrides (got {type(arms_raw).__name__})"
        )
    overrides = overrides or {}
    arm_names = list(arms_raw) or ["main"]
    resolved: dict[str, ExperimentConfig] = {}
    for arm_name in arm_names:
        if arms_raw:
            try:
                check_safe_name(
                    arm_name if isinstance(arm_name, str) else repr(arm_name), "it names a checkpoint folder and an MLflow run"
                )
            except ValueError as error:
                raise ConfigError(
                    f"{source}: invalid experiment config\n  - arms.{arm_name}: {error} (got {arm_name!r})"
                ) from None
        arm_overrides = arms_raw.get(arm_name) or {}
        if not isinstance(arm_overrides, dict):
            raise ConfigError(f"{source}: invalid experiment config\n  - arms.{arm_name}: expected a mapping of overrides")
        merged = deep_merge(deep_merge(raw, expand_dotted(arm_overrides)), overrides)
        # The objective's own preset (e.g. REINFORCE++'s KL in the reward), under the explicit keys.
        merged = deep_merge(objective_preset_overrides(merged), merged)
        preset = merged.get("preset")
        if preset is not None:
            if preset not in PRESETS:
                raise ConfigError(
                    f"{source}: invalid experiment config\n  - preset: unknown preset {preset!r}; allowed: {', '.join(PRESETS)}"
                )
            try:
                merged = deep_merge(preset_overrides(preset, merged), merged)
            except PresetError as error:
                raise ConfigError(f"{source}: invalid experiment config\n  - preset: {error}") from None
        # An arm or --set that turns a feature off keeps the base's settings of it (inert_settings.py).
        exempt = switched_off_later([raw, expand_dotted(arm_overrides), overrides])
        try:
            config = ExperimentConfig.model_validate(merged, context={"inert_exempt": exempt})
        except ValidationError as error:
            # Report arm errors at the arm's path when the bad key came from the arm.
            raise ConfigError(
                format_validation_error(
                    error, source=source + (f" (arm {arm_name!r})" if arms_raw else ""), model=ExperimentConfig
                )
            ) from None
        resolved[arm_name] = config
    return resolved


def load_experiment(path: str | Path, *, set_options: list[str] | None = None) -> dict[str, ExperimentConfig]:
    raw = read_yaml(path)
    overrides = parse_set_options(set_options or [])
    return resolve_arms(raw, source=str(path), overrides=overrides)


def to_yaml(config: ExperimentConfig) -> str:
    """The resolved config as YAML, without the fields that do nothing in it (defaults there), so
    that it validates again (polyrl.config.inert_settings)."""
    text: str = yaml.safe_dump(drop_idle(config, config.model_dump(mode="json")), sort_keys=False)
    return text
