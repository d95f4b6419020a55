"""``rollout:``: the sampling engine, how many samples per step, and how they are sampled."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from polyrl.config.base import StrictModel


class TruncatedImportanceSamplingConfig(StrictModel):
    """Correct for the sampler/learner log-prob gap (Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL training')."""

    enabled: bool = Field(
        False,
        description="Weight each response token's advantage by min(π_old/π_sampler, cap): the learner's log-prob over "
        "the rollout engine's, for the same token (logged as rollout/tis_weight_mean). Not with "
        "objective.rollout_correction, which covers the same with more choices.",
    )
    cap: float = Field(
        2.0,
        gt=1.0,
        description="C: the truncation of each token's importance weight (enabled: true only; refused when written with enabled: false).",
    )


class WorkerResourcesConfig(StrictModel):
    """What each rollout worker (``rollout.workers > 1``) reserves on the Ray cluster, and how they are placed."""

    num_cpus: float = Field(
        1.0, gt=0, description="Ray CPUs per worker (a fraction shares a core); its torch threads: max(1, int(num_cpus))"
    )
    num_gpus: float = Field(
        0.0, ge=0, description="GPUs per worker (a fraction shares one, e.g. 0.5 puts two vLLM engines on a GPU)"
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK",
        description="Ray placement-group strategy of the workers' bundles: PACK fills a node first, SPREAD spreads over nodes",
    )
    max_restarts: int = Field(
        3, ge=0, description="times Ray restarts a worker that died (per worker, per run); its prompts go again"
    )
    ready_timeout_s: float = Field(120.0, gt=0, description="how long to wait for room on the cluster before failing")


def _field_error(loc: tuple[str, ...], message: str, value: object, **context: str) -> ValidationError:
    error = PydanticCustomError("value_error", message, context)
    return ValidationError.from_exception_data("RolloutConfig", [InitErrorDetails(type=error, loc=loc, input=value)])


class RolloutConfig(StrictModel):
    """How samples are generated: the engine, prompts and samples per step, the sampling settings, the
    rollout workers and asynchronous (off-policy) generation."""

    engine: Literal["vllm", "hf"] = Field(
        "vllm",
        description="What generates the rollouts: 'vllm' (vLLM's engine; weights synced into it after each update) or "
        "'hf' (transformers' generate, same per-request seeding; no rollout.compile, no LoRA adapter sync).",
    )
    prompts_per_step: int = Field(
        8,
        ge=1,
        description="Prompts drawn from the training data per step (each step's batch is prompts_per_step × "
        "samples_per_prompt samples); with advantage.dynamic_sampling, the number of informative groups kept. A size "
        "preset sets it from its batch when it is not written.",
    )
    samples_per_prompt: int = Field(
        8,
        ge=1,
        description="Completions sampled per prompt: the group over which group-relative estimators (GRPO, RLOO...) "
        "compute each advantage; with env:, episodes per prompt.",
    )
    temperature: float = Field(
        1.0,
        gt=0,
        description="Sampling temperature; the learner divides its logits by the same value, so its log-probs are "
        "those of the distribution the samples came from.",
    )
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Nucleus sampling: sample from the smallest set of tokens whose probability reaches top_p. Below 1 "
        "the sampler's log-probs are renormalised over the nucleus, so the log-prob-gap health check is off and "
        "asynchronous training (max_staleness > 0) is refused.",
    )
    max_tokens: int = Field(
        64,
        ge=1,
        description="The longest response in tokens (with env:, of one assistant turn); a sample cut there is truncated "
        "(advantage.overlong). Also the default L_max of advantage.overlong and the normaliser of the "
        "seq_sum_constant_norm aggregation.",
    )
    max_model_len: int = Field(
        512,
        ge=16,
        description="Positions the rollout engine holds per sequence, prompt and response together; a training prompt "
        "of this many tokens or more (or of the model's own max_position_embeddings, if smaller) is refused before "
        "training, naming its rows.",
    )
    kv_cache_gb: float | Literal["auto"] = Field(
        "auto",
        description="vLLM's KV cache in GiB, or auto: what one step's generation holds (prompts_per_step x "
        "samples_per_prompt sequences of the longest training prompt + max_tokens; polyrl/engines/kv_cache.py). On the "
        "CPU the whole cache is resident memory, so a fixed size above the need is memory the run never uses; below it "
        "vLLM queues sequences (slower, same samples). With periodic evaluation (eval.every), whose batches are not sized "
        "here, auto is the former fixed 1 GiB. A size is refused with engine: hf, which keeps no such cache.",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="torch threads while generating (restored for the learner after); default: the learner's count. "
        "Measure before changing it: bench/bench_runtime_env.py, and the run's own perf/generate_s.",
    )
    dtype: Literal["float32", "bfloat16"] | None = Field(
        None,
        description="The dtype the rollout engine samples in; default: model.dtype. bfloat16 under a float32 "
        "learner samples at bf16 speed (much faster with AMX on a recent Xeon) while the learner keeps fp32; the "
        "sampler then differs from the learner by bf16 rounding (rollout/logprob_gap ~4e-3 nats/token against ~5e-7 in "
        "fp32), a small off-policy gap that rollout.truncated_importance_sampling corrects.",
    )
    compile: bool = Field(
        False,
        description="vLLM compiles the sampler's forward (torch.compile with Inductor; on CUDA also CUDA graphs) "
        "instead of running it eagerly: faster generation for a longer start-up (docs/benchmarks.md), so it pays on "
        "runs of more than a few dozen rollout-heavy steps. Weight syncs "
        "reach the compiled model (it reads the same parameters). vllm engine and text policies only.",
    )
    truncated_importance_sampling: TruncatedImportanceSamplingConfig = TruncatedImportanceSamplingConfig()
    workers: int = Field(
        1,
        ge=1,
        description="rollout engines: 1 runs the engine in this process; N > 1 runs N engines as Ray actors "
        "(rollout.worker_resources), each generating a contiguous share of every step's prompts with the same per-request "
        "seeds, so the samples do not depend on N; weights reach every worker after each update.",
    )
    worker_resources: WorkerResourcesConfig | None = Field(
        None, description="each rollout worker's Ray resources and placement (rollout.workers > 1; default: 1 CPU, no GPU)"
    )
    weight_sync: Literal["auto", "object_store", "broadcast"] = Field(
        "auto",
        description="How the learner's weights reach the rollout workers (rollout.workers > 1): 'object_store' "
        "(Ray's, one host copy per sync), 'broadcast' (a torch.distributed group from the driver's learner to the workers: "
        "NCCL when the learner and workers are on CUDA, else gloo; polyrl/engines/weight_broadcast.py), 'auto': broadcast "
        "when both are on CUDA (train.device, rollout.worker_resources.num_gpus), else the object store.",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="Asynchronous, off-policy training (polyrl/trainer/async_loop.py): generation of the next k "
        "batches overlaps the current update, and no sample older than k policy versions trains (generation waits rather "
        "than run further ahead). The ratio's old log-probs are then the sampler's (the behaviour policy). 0: the "
        "synchronous loop, unchanged.",
    )

    @model_validator(mode="after")
    def _positive_kv_cache(self) -> "RolloutConfig":
        if self.kv_cache_gb != "auto" and not self.kv_cache_gb > 0:
            raise _field_error(
                ("kv_cache_gb",),
                "kv_cache_gb must be a positive number of GiB or auto; got {got}",
                self.kv_cache_gb,
                got=repr(self.kv_cache_gb),
            )
        return self

    @model_validator(mode="after")
    def _compile_needs_vllm(self) -> "RolloutConfig":
        """The HF engine has no compiled mode; accepting the setting there would do nothing."""
        if self.compile and self.engine != "vllm":
            error = PydanticCustomError(
                "value_error",
                "compile is vLLM's compiled sampler, but engine is {engine}; allowed here: {allowed}",
                {"engine": repr(self.engine), "allowed": "compile: false, or engine: vllm"},
            )
            raise ValidationError.from_exception_data(
                "RolloutConfig", [InitErrorDetails(type=error, loc=("compile",), input=True)]
            )
        return self

    @model_validator(mode="after")
    def _workers_settings(self) -> "RolloutConfig":
        """Settings that only apply to one kind of rollout are refused on the other."""
        if self.worker_resources is not None and self.workers == 1:
            raise _field_error(
                ("worker_resources",),
                "worker_resources applies to rollout workers, but workers is 1 (the in-process engine); allowed here: {allowed}",
                self.worker_resources.model_dump(),
                allowed="workers > 1, or no worker_resources",
            )
        if self.workers > self.prompts_per_step:
            raise _field_error(
                ("workers",),
                "{workers} workers for {prompts} prompts per step: a worker would get no prompt; allowed: {allowed}",
                self.workers,
                workers=str(self.workers),
                prompts=str(self.prompts_per_step),
                allowed=f"1 to {self.prompts_per_step} (rollout.prompts_per_step)",
            )
        if self.weight_sync != "auto" and self.workers == 1:
            raise _field_error(
                ("weight_sync",),
                "weight_sync chooses how rollout workers get the weights, but workers is 1 (the "
                "in-process engine shares them); allowed here: {allowed}",
                self.weight_sync,
                allowed="auto, or workers > 1",
            )
        if self.threads is not None and self.workers > 1:
            raise _field_error(
                ("threads",),
                "threads sets this process's torch threads while the in-process engine generates; "
                "rollout workers run {threads_of_workers}; allowed here: {allowed}",
                self.threads,
                threads_of_workers="max(1, int(rollout.worker_resources.num_cpus)) threads each",
                allowed="no threads, or workers: 1",
            )
        return self

    @model_validator(mode="after")
    def _staleness_needs_full_distribution_and_own_threads(self) -> "RolloutConfig":
        """Off-policy training reads the sampler's log-probs as the behaviour policy; with top_p < 1
        they are renormalised over the nucleus, not the policy's own, so every ratio would be off.
        rollout.threads sets torch's process-wide thread count, which the overlapping update shares."""
        if not self.max_staleness:
            return self
        reason = (
            "top_p < 1 renormalises the sampler's log-probs over the nucleus, so they are not the behaviour policy's "
            "log-probs the ratio needs"
            if self.top_p < 1
            else "threads sets torch's process-wide thread count, which the update running at the same time would share"
            if self.threads is not None
            else None
        )
        if reason is not None:
            raise _field_error(
                ("max_staleness",),
                "max_staleness {k} (asynchronous training): {reason}; allowed here: {allowed}",
                self.max_staleness,
                k=str(self.max_staleness),
                reason=reason,
                allowed="max_staleness: 0, or top_p: 1 and no threads",
            )
        return self
