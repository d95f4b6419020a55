"""``rollout:``: the sampling engine, how many samples per step, and how they are sampled."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from polyrl.config.base import StrictModel


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
