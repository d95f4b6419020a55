"""Building an arm's models from its config: the policy (fp32 master weights, LoRA, gradient
checkpointing, compiled layers, the padding-free decision), the KL reference, the critic, the
CPU matmul route, and the learner that trains them (in this process, or data-parallel ranks).

Every decision here reads the config, so the learner and critic only see their own settings.
:mod:`polyrl.learner.ranks` builds each rank's copy the same way from a :class:`RankRecipe`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from polyrl.algos.advantages import get_advantage
from polyrl.algos.entropy_control import AdaptiveEntropySettings
from polyrl.algos.objectives import get_objective
from polyrl.config.schema import ExperimentConfig
from polyrl.engines.image_prompts import auto_model_class, model_takes_images
from polyrl.learner.critic import Critic, CriticSettings, build_value_model
from polyrl.learner.policy_learner import LearnerSettings, PolicyLearner
from polyrl.learner.ranks import DataParallelLearner, RankRecipe, start_data_parallel_learner
from polyrl.modeling.attention import attend_in_fp32_on_cpu
from polyrl.modeling.freeze import freeze_parameters
from polyrl.modeling.gradient_checkpointing import GradientCheckpointingError, checkpoint_layers
from polyrl.modeling.lora import LoraPolicy, add_lora
from polyrl.modeling.packing import resolve_padding_free, use_packed_rows_attention
from polyrl.modeling.shared_prompts import SharePromptsError, sharing_refusal
from polyrl.runtime.compiled import compile_decoder_layers
from polyrl.runtime.cpu_matmul import resolve_cpu_matmul, route_linears_through_onednn
from polyrl.runtime.devices import learner_device
from polyrl.runtime.host_memory import keep_freed_host_memory
from polyrl.runtime.precision import compute_dtype

__all__ = ["Models", "bf16_learner_attends_in_fp32", "build_models", "learner_settings"]


@dataclass
class Models:
    """What :func:`build_models` built: the models, the learner that trains them, and the
    decisions the rest of the arm reads (the pipeline, the run's recorded parameters)."""

    policy: torch.nn.Module  # the model the learner's forwards run (with LoRA: PEFT's wrapped model)
    lora: LoraPolicy | None
    reference: torch.nn.Module | None  # the KL reference; ``policy`` itself with LoRA (adapter off)
    critic: Critic | None  # built where the advantage estimator requires values
    learner: PolicyLearner | DataParallelLearner
    estimator: Any  # the advantage estimator (algos/advantages registry)
    device: torch.device
    dtype: torch.dtype  # the compute dtype (model.dtype); the weights are fp32
    takes_images: bool
    padding_free: bool
    cpu_matmul: str  # resolved train.cpu_matmul
    host_malloc: str  # what keep_freed_host_memory did (recorded as runtime.host_malloc)
    # Why train.padding_free: auto turned it off (the probe's verdict, polyrl.modeling.probes); None when on or set false.
    padding_free_reason: str | None = None


def response_budget(cfg: ExperimentConfig) -> int:
    """The most policy tokens one sample holds (Dr.GRPO's constant normaliser): one completion's
    ``rollout.max_tokens``, or with ``env:`` an episode's ``env.max_episode_tokens`` (its turns together)."""
    return cfg.env.max_episode_tokens if cfg.env is not None else cfg.rollout.max_tokens


def learner_settings(cfg: ExperimentConfig, objective: Any, padding_free: bool = False) -> LearnerSettings:
    t = cfg.train
    return LearnerSettings(
        aggregation=cfg.objective.aggregation or objective.default_aggregation,
        objective_params={**objective.default_params, **cfg.objective.params}, learning_rate=t.learning_rate, betas=tuple(t.betas),
        weight_decay=t.weight_decay, lr_schedule=t.lr_schedule, warmup_steps=t.warmup_steps, min_lr_ratio=t.min_lr_ratio,
        total_steps=t.steps, updates_per_batch=t.updates_per_batch, mini_batches=t.mini_batches, micro_batch_size=t.micro_batch_size,
        micro_batch_tokens=t.micro_batch_tokens, share_prompts=t.share_prompts, padding_free=padding_free,
        max_grad_norm=t.max_grad_norm, max_consecutive_nonfinite=t.max_consecutive_nonfinite, temperature=cfg.rollout.temperature,
        max_tokens=response_budget(cfg), kl_coef=0.0 if t.kl_in_reward else t.kl_coef, kl_estimator=t.kl_estimator,
        entropy_coef=t.entropy_coef, seed=cfg.seed, compute_dtype=compute_dtype(cfg.model.dtype),
        entropy_control=_adaptive_entropy(cfg), high_entropy_top_ratio=(
            cfg.objective.high_entropy_tokens.top_ratio if cfg.objective.high_entropy_tokens is not None else None),
    )  # fmt: skip


def _adaptive_entropy(cfg: ExperimentConfig) -> AdaptiveEntropySettings | None:
    a = cfg.objective.adaptive_entropy
    return None if a is None else AdaptiveEntropySettings(target=a.target, step_size=a.step_size, max_coef=a.max_coef)


def critic_settings(cfg: ExperimentConfig) -> CriticSettings:
    v = cfg.train.value
    return CriticSettings(
        learning_rate=v.learning_rate,
        betas=tuple(v.betas),
        weight_decay=v.weight_decay,
        clip_range=v.clip_range,
        max_grad_norm=v.max_grad_norm,
        update_every=v.update_every,
        micro_batch_size=cfg.train.micro_batch_size,
        max_consecutive_nonfinite=cfg.train.max_consecutive_nonfinite,
        compute_dtype=compute_dtype(cfg.model.dtype),
    )


def bf16_learner_attends_in_fp32(model: torch.nn.Module, dtype: torch.dtype) -> bool:
    """A learner model computing in bf16 on CPU runs its attention kernel in fp32
    (:mod:`polyrl.modeling.attention`: torch's CPU flash-attention backward is slow in bf16)."""
    if dtype == torch.float32 or next(model.parameters()).device.type != "cpu":
        return False
    return attend_in_fp32_on_cpu(model)


def _load(policy_path: Path, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    # fp32 master weights and optimizer state; model.dtype is the compute dtype (runtime/precision.py).
    # Image-text models load whole (AutoModelForImageTextToText): the learner's forward needs the vision tower.
    model = auto_model_class(policy_path).from_pretrained(str(policy_path), dtype=torch.float32).to(device)
    bf16_learner_attends_in_fp32(model, dtype)
    return model


def build_models(cfg: ExperimentConfig, policy_path: Path) -> Models:
    """The policy, reference, critic and learner for ``cfg``, in the order their refusals are
    cheapest: every config refusal about the policy comes before the reference and critic load
    and before any learner rank starts."""
    dtype = compute_dtype(cfg.model.dtype)
    device = learner_device(cfg.train.device)
    host_malloc = keep_freed_host_memory() if device.type == "cpu" else "unchanged: the learner is on a GPU"
    policy = _load(policy_path, device, dtype)
    takes_images = model_takes_images(policy_path)
    if cfg.model.freeze is not None:  # before anything counts trainable parameters (the optimizer, LoRA)
        f = cfg.model.freeze
        freeze_parameters(policy, parts=f.parts, first_layers=f.first_layers, patterns=f.patterns)
    lora = None
    if cfg.model.lora is not None:
        # The learner trains the same model with PEFT's LoRA layers injected; only they train.
        lora = add_lora(policy, r=cfg.model.lora.r, alpha=cfg.model.lora.alpha, target_modules=cfg.model.lora.target_modules)
        policy = lora.model
    if cfg.train.gradient_checkpointing:
        if cfg.train.compile:
            raise GradientCheckpointingError(
                "train.gradient_checkpointing with train.compile: not supported together (a compiled "
                "layer inside a recomputed one was never checked here); set one of them to false"
            )
        checkpoint_layers(policy)
    if cfg.train.share_prompts and (refusal := sharing_refusal(policy, takes_images=takes_images)):
        raise SharePromptsError(f"train.share_prompts: {refusal}; set it to false")
    padding_free, padding_free_reason = resolve_padding_free(  # probes the policy (polyrl.modeling.probes)
        cfg.train.padding_free,
        policy,
        takes_images=takes_images,
        share_prompts=cfg.train.share_prompts,
        compile=cfg.train.compile,
    )
    if cfg.train.compile:
        compile_decoder_layers(policy, takes_images=takes_images)
    reference = None
    if cfg.train.kl_coef > 0 and lora is not None:
        reference = policy  # the KL reference is the base model: this policy with its adapter off (pipeline's reference_scope)
    elif cfg.train.kl_coef > 0:
        # Same storage dtype and autocast as the policy: KL is exactly 0 before the first update.
        reference = _load(policy_path, device, dtype).eval()
        reference.requires_grad_(False)
    for model in (policy, reference) if padding_free else ():
        if model is not None:
            use_packed_rows_attention(model)  # the attention wrapper: per-row on packed forwards, unchanged on padded ones
    objective = get_objective(cfg.objective.name)
    estimator = get_advantage(cfg.advantage.estimator or objective.default_advantage)
    critic = (
        Critic(build_value_model(policy_path, torch.float32).to(device), critic_settings(cfg))
        if "values" in estimator.requires
        else None
    )
    if critic is not None:
        bf16_learner_attends_in_fp32(getattr(critic.model, "model", critic.model), dtype)  # the value model's base
        if cfg.train.gradient_checkpointing:
            checkpoint_layers(critic.model, role="critic")
    cpu_matmul = resolve_cpu_matmul(cfg.train.cpu_matmul, device=next(policy.parameters()).device, compute_dtype=dtype)
    if cpu_matmul == "onednn":
        route_linears_through_onednn(policy, traceable=cfg.train.compile)  # compiled: custom ops Inductor keeps whole
        for module in (reference, critic.model if critic is not None else None):
            if module is not None and module is not policy:
                route_linears_through_onednn(module)
    learner: PolicyLearner | DataParallelLearner = PolicyLearner(
        policy, objective, learner_settings(cfg, objective, padding_free), critic=critic, lora=lora
    )
    if cfg.train.learner_workers > 1:  # this learner becomes the driver's mirror of rank 0 (learner/ranks.py)
        learner = start_data_parallel_learner(
            learner,
            RankRecipe(
                policy_path=str(policy_path),
                objective=cfg.objective.name,
                settings=learner.settings,
                critic=critic.settings if critic is not None else None,
                padding_free=padding_free,
                gradient_checkpointing=cfg.train.gradient_checkpointing,
                cpu_matmul=cpu_matmul,
                threads=cfg.train.threads or 1,
                cuda=device.type == "cuda",
            ),
            cfg.train.learner_workers,
        )
    return Models(
        policy=policy,
        lora=lora,
        reference=reference,
        critic=critic,
        learner=learner,
        estimator=estimator,
        device=device,
        dtype=dtype,
        takes_images=takes_images,
        padding_free=padding_free,
        padding_free_reason=padding_free_reason,
        cpu_matmul=cpu_matmul,
        host_malloc=host_malloc,
    )
