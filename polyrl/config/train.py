"""``train:``: the learner's optimisation (steps, optimiser, micro-batches, KL, schedule), where and
how it runs (device, compile, CPU GEMM library), and the critic's own optimiser (``train.value``)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from polyrl.config.base import StrictModel


class ValueConfig(StrictModel):
    """Critic for PPO/GAE; built only when the advantage estimator needs values (written for one that
    does not, it is refused).

    The critic has its own optimizer (as in verl and OpenRLHF), so a value-loss coefficient
    would only rescale its learning rate: there is no ``coef``; set ``learning_rate``.
    """

    learning_rate: float = Field(1e-4, gt=0, description="The critic's AdamW learning rate (constant).")
    betas: tuple[float, float] = Field((0.9, 0.999), description="The critic's AdamW (β1, β2).")
    weight_decay: float = Field(0.0, ge=0, description="The critic's AdamW decoupled weight decay.")
    max_grad_norm: float = Field(
        1.0, gt=0, description="Clip the critic's gradient to this global L2 norm before each critic step."
    )
    clip_range: float = Field(
        0.2,
        gt=0,
        description="Value clipping (PPO, arXiv 1707.06347, as in OpenAI baselines): the new value may move at most "
        "this far from the old one in the clipped term of the value loss, which takes the larger of the clipped and "
        "unclipped squared errors.",
    )
    update_every: int = Field(
        1,
        ge=1,
        description="Delayed critic updates: one critic update every k policy optimizer steps (polyrl's own option, "
        "not from a paper; 1: every step).",
    )


class TrainConfig(StrictModel):
    """The learner's optimisation: steps, AdamW, micro-batches, KL and entropy terms, the learning-rate
    schedule, where and how it runs, and the critic (train.value)."""

    steps: int = Field(
        20,
        ge=1,
        description="Training steps: each generates one rollout batch and updates on it (updates_per_batch × "
        "mini_batches optimizer steps). Checkpoints, sample tables and evaluation count in these steps.",
    )
    learning_rate: float = Field(
        1e-5, gt=0, description="The policy's AdamW learning rate (peak, after warm-up; lr_schedule decays from it)."
    )
    weight_decay: float = Field(0.0, ge=0, description="The policy's AdamW decoupled weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="The policy's AdamW (β1, β2).")
    max_grad_norm: float = Field(
        1.0,
        gt=0,
        description="Clip the policy's gradient to this global L2 norm before each optimizer step.",
    )
    micro_batch_size: int = Field(
        16,
        ge=1,
        description="Rows per forward/backward pass; gradients accumulate over a mini-batch's micro-batches, so the "
        "update does not depend on it (up to float rounding), only the memory does. With micro_batch_tokens, the most "
        "rows a micro-batch may hold. The critic uses it too.",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Cut the update's micro-batches by token positions (rows × longest row; with padding_free, "
        "the rows' own tokens) instead of a row count, at most micro_batch_size rows each (verl's use_dynamic_bsz); exact, "
        "the loss normaliser spans the mini-batch.",
    )
    share_prompts: bool = Field(
        False,
        description="The G completions of a prompt run as one packed row in the learner's forward (prompt once, "
        "a 4-D mask keeps completions apart; Prefix Grouper), where a FLOP cost model says it pays. Same log-probs and "
        "gradients up to float rounding; the more of each row the prompt is, the more it saves (docs/benchmarks.md). Text "
        "policies with sdpa/eager attention whose layers mix tokens only in attention (a set-up probe refuses the "
        "others, docs/architectures.md); micro-batches are then whole packs (not with micro_batch_tokens).",
    )
    padding_free: bool | Literal["auto"] = Field(
        "auto",
        description="The learner's forwards (update, π_old and reference log-probs) run each micro-batch's rows end "
        "to end with their own positions and no padding columns (verl's remove-padding, OpenRLHF's packed samples); "
        "attention stays within each row. Same log-probs, entropy and gradients up to float rounding. Text policies with "
        "sdpa attention, not with share_prompts or compile; models whose layers mix tokens outside attention (e.g. "
        "Falcon-H1, LFM2) are found by a set-up probe (docs/architectures.md). 'auto': on where it applies, else off with "
        "the reason said at the start (recorded as runtime.padding_free, runtime.padding_free_reason); true: refused "
        "where it cannot apply.",
    )
    updates_per_batch: int = Field(1, ge=1, description="Optimizer updates per rollout batch (off-policy reuse).")
    mini_batches: int = Field(1, ge=1, description="Split each rollout batch into this many optimizer steps per update pass.")
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="β of the KL penalty to a frozen reference policy (the starting weights; with LoRA, the base model "
        "with the adapter off): kl_coef × KL per token is added to the loss, or with kl_in_reward subtracted from the "
        "reward. > 0 loads the reference; logged as actor/ref_kl.",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="Per-token KL estimator (Schulman, 'Approximating KL Divergence', 2020): k1 = log π − log π_ref "
        "(unbiased, can be negative), k2 = ½(log π − log π_ref)² (biased, ≥ 0), k3 = ρ − log ρ − 1 with ρ = π_ref/π "
        "(unbiased, ≥ 0; GRPO's, DeepSeekMath arXiv 2402.03300). Applies where kl_coef > 0 (refused when written with kl_coef 0).",
    )
    kl_in_reward: bool = Field(
        False,
        description="Put the KL penalty in the reward instead of the loss (InstructGPT's placement): each token's "
        "reward is −kl_coef × KL(π_old ‖ π_ref), plus the sequence reward on the last token, before the advantage "
        "estimator. Refused with kl_coef 0, where it would do nothing.",
    )
    entropy_coef: float = Field(
        0.0,
        description="Entropy bonus: coef × the per-token entropy is subtracted from the loss (positive keeps the "
        "policy exploring; negative would lower its entropy). The starting value when objective.adaptive_entropy is set.",
    )
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="Per optimizer step, after warm-up: constant, linear or cosine decay to learning_rate × min_lr_ratio.",
    )
    warmup_steps: int = Field(
        0, ge=0, description="Optimizer steps of linear warm-up (steps × updates_per_batch × mini_batches in all)."
    )
    min_lr_ratio: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Where linear/cosine decay ends, as a fraction of learning_rate (refused with lr_schedule constant).",
    )
    max_consecutive_nonfinite: int = Field(
        3,
        ge=1,
        description="Stop (with a checkpoint of the last good weights) after this many optimizer steps in a row skipped for a NaN/inf loss or gradient norm.",
    )
    value: ValueConfig = ValueConfig()
    learner_workers: int = Field(
        1,
        ge=1,
        description="Learner ranks (data parallel, polyrl.learner.ranks): Ray actors in one torch.distributed "
        "group (gloo on CPU, NCCL + FSDP2 on CUDA, one GPU each), each training on its shard of every mini-batch with the "
        "normaliser and gradients summed over the ranks: the same update as one process. 1: the learner in this process. "
        "Not with model.lora, train.compile or train.share_prompts.",
    )
    threads: int | None = Field(
        None, ge=1, description="torch intra-op threads; default: OMP_NUM_THREADS when set, else all cores."
    )
    device: str = Field(
        "auto",
        description="Where the learner's models (policy, reference, critic) live: 'auto' (the first CUDA device when "
        "torch sees one, else the CPU), 'cpu', 'cuda' or 'cuda:N'. An explicit CUDA device the machine lacks is refused, "
        "not replaced by the CPU. Recorded as runtime.learner_device.",
    )
    compile: bool = Field(
        False,
        description="torch.compile each of the policy's decoder layers (text policies; dynamic shapes; one graph shared "
        "by all layers): fuses the element-wise work between the matmuls (oneDNN's, with train.cpu_matmul). A one-off "
        "compile buys a faster update (docs/benchmarks.md), so it pays on runs longer than a few minutes of updates; off "
        "by default.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward instead of keeping them (policy and "
        "critic; torch.utils.checkpoint, non-reentrant): activation memory of one layer instead of all, for about one "
        "more forward pass of compute. Same gradients.",
    )
    cpu_matmul: Literal["auto", "onednn", "torch"] = Field(
        "auto",
        description="GEMM library of the learner's fp32 Linear layers on CPU (policy, reference, critic): 'onednn' "
        "(what vLLM's CPU backend uses; same fp32 maths, faster on AMD CPUs, where MKL runs AVX2 "
        "kernels) or 'torch' (its default BLAS, MKL; faster than oneDNN on Intel CPUs; docs/benchmarks.md). 'auto': oneDNN when "
        "torch's BLAS is MKL on a CPU that is not Intel's, model.dtype is float32 and this torch has oneDNN; else torch. "
        "Recorded as runtime.cpu_matmul, with runtime.cpu_vendor and runtime.torch_blas.",
    )

    @field_validator("device")
    @classmethod
    def _device_form(cls, device: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
            raise ValueError(f"unknown device {device!r}; allowed: 'auto', 'cpu', 'cuda', 'cuda:N' (N a device index)")
        return device
