"""Assembling one arm from its config: the data, the models (:mod:`polyrl.trainer.build_models`),
the rewards, the rollout side (:mod:`polyrl.trainer.build_rollout`), the teacher, the batch
pipeline, health checks and checkpointer, into an :class:`~polyrl.trainer.arm.Arm`; the Ray it
reserves first (:func:`ray_demand`); the latest checkpoint restored on resume. Every decision
that reads the config lives in these set-up modules, so the roles themselves only see their
own settings.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoTokenizer

from polyrl.config.rollout import WorkerResourcesConfig
from polyrl.config.schema import ExperimentConfig
from polyrl.engines.base import RolloutEngine
from polyrl.engines.image_prompts import model_takes_images
from polyrl.monitoring.health import HealthMonitor
from polyrl.policies.paths import resolve_policy_path
from polyrl.runtime.compiled import check_sampler_compile
from polyrl.runtime.cpu_matmul import cpu_vendor, torch_blas
from polyrl.runtime.devices import learner_device
from polyrl.runtime.precision import compute_dtype
from polyrl.runtime.ray_cluster import RayDemand, acquire_ray, release_ray
from polyrl.runtime.threads import set_torch_threads
from polyrl.trainer.arm import Arm
from polyrl.trainer.build_data import build_rewards, build_sampler, training_rows
from polyrl.trainer.build_models import Models, build_models
from polyrl.trainer.build_rollout import RolloutSide, adapter_sync, build_collector, build_rollout
from polyrl.trainer.build_teacher import build_teacher, teacher_source
from polyrl.trainer.hooks import Checkpointer
from polyrl.trainer.loop import sync_policy
from polyrl.trainer.pipeline import BatchPipeline, PipelineContext, pipeline_stages
from polyrl.trainer.protocols import ChecksOverlap, Evaluator, Tracker

__all__ = ["build_arm", "ray_demand", "reuses_old_logprobs", "seed_everything"]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def reuses_old_logprobs(cfg: ExperimentConfig) -> bool:
    """With one on-policy optimizer step per rollout batch, π_old is the policy of the update's
    own forward pass, so a separate no-grad pass over the batch would compute the same numbers
    again; the update reads them off its first pass instead."""
    return (
        cfg.train.updates_per_batch == 1
        and cfg.train.mini_batches == 1
        and not cfg.rollout.truncated_importance_sampling.enabled
        and not cfg.train.kl_in_reward
    )


def ray_demand(cfg: ExperimentConfig, *, rollout_workers: bool = True) -> RayDemand:
    """What the arm reserves on the Ray cluster: rollout workers, learner ranks (one CPU per
    ``train.threads``, a GPU each on CUDA), remote reward actors (runtime/ray_cluster.py)."""
    parts = []
    r, t = cfg.rollout, cfg.train
    if r.workers > 1 and rollout_workers:
        each = r.worker_resources or WorkerResourcesConfig()
        parts.append(
            (f"rollout.workers {r.workers} × rollout.worker_resources", r.workers * each.num_cpus, r.workers * each.num_gpus)
        )
    if t.learner_workers > 1:
        cuda = learner_device(t.device).type == "cuda"
        parts.append(
            (
                f"train.learner_workers {t.learner_workers} × train.threads {t.threads or 1}",
                t.learner_workers * (t.threads or 1),
                float(t.learner_workers) if cuda else 0.0,
            )
        )
    for index, spec in enumerate(cfg.rewards):
        if spec.remote_resources is not None:
            parts.append((f"rewards[{index}].remote", spec.remote_resources.num_cpus, spec.remote_resources.num_gpus))
    return RayDemand(tuple(parts))


def build_arm(
    config: ExperimentConfig,
    *,
    arm: str,
    arm_dir: str | Path,
    logger: Tracker | None = None,
    evaluator: Evaluator | None = None,
    checkpoint_extra: dict[str, Any] | None = None,
    resume: bool = False,
    engine: RolloutEngine | None = None,
    teacher_path: str | Path | None = None,
) -> Arm:
    """Build models, engine, data and rewards into roles; restore the latest checkpoint if ``resume``.

    ``engine`` replaces the configured rollout engine (its caller closes nothing: :meth:`Arm.close` does).
    ``teacher_path``: the model folder of ``distill.teacher.run`` (the launcher finds and exports the run).
    A run with Ray actors first acquires Ray for all of them (:func:`ray_demand`): a local cluster
    sized for them, or a refusal naming them when the cluster is too small in all.
    """
    demand = ray_demand(config, rollout_workers=engine is None)
    holds_ray = bool(demand.parts)
    if holds_ray:
        acquire_ray(demand)
    try:
        built = _build_arm(
            config,
            arm=arm,
            arm_dir=arm_dir,
            logger=logger,
            evaluator=evaluator,
            checkpoint_extra=checkpoint_extra,
            resume=resume,
            engine=engine,
            teacher_path=teacher_path,
        )
    except BaseException:
        if holds_ray:
            release_ray()
        raise
    built.holds_ray = holds_ray
    return built


def _build_arm(
    config: ExperimentConfig,
    *,
    arm: str,
    arm_dir: str | Path,
    logger: Tracker | None,
    evaluator: Evaluator | None,
    checkpoint_extra: dict[str, Any] | None,
    resume: bool,
    engine: RolloutEngine | None,
    teacher_path: str | Path | None = None,
) -> Arm:
    cfg = config
    build_started = time.perf_counter()
    if cfg.train.threads:
        set_torch_threads(cfg.train.threads)
    seed_everything(cfg.seed)
    # The data (every row's images decoded) before any model is built or loaded: a bad row costs seconds.
    rows = training_rows(cfg)
    policy_path = resolve_policy_path(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(str(policy_path))
    sampler = build_sampler(cfg, rows, policy_path, tokenizer)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if cfg.rollout.compile and engine is None:  # refused before any model loads
        check_sampler_compile(takes_images=model_takes_images(policy_path))
    teacher_from = teacher_source(cfg, policy_path, tokenizer, run_path=teacher_path)  # its refusals before any model loads
    models = build_models(cfg, policy_path)
    teacher = None
    if teacher_from is not None:
        teacher = build_teacher(cfg, teacher_from, device=models.device, dtype=models.dtype, pad_token_id=pad_token_id)
    learner, critic = models.learner, models.critic
    rewards, label = build_rewards(cfg, policy_path, sampler)
    rollout = build_rollout(cfg, policy_path, tokenizer, sampler.samples, takes_images=models.takes_images, engine=engine)
    if logger is not None:
        _log_runtime(logger, models, rollout, build_started)
        if teacher is not None:
            logger.log_params({"runtime.teacher_path": str(teacher.path)})  # a run's teacher: the export it resolved to
    collector = build_collector(cfg, rollout.engine, rewards, sampler.next_batch, accuracy_label=label, teacher=teacher)
    pipeline = BatchPipeline(
        _pipeline_context(cfg, models, pad_token_id, reward_weights=dict(rewards.weights)), pipeline_stages(cfg.distill)
    )
    r = cfg.rollout
    # Asynchronous training too: the gap is measured on the rows sampled at the learner's weights
    # (staleness 0), so it stays a sync check (polyrl/learner/policy_learner.py, rows_to_diagnose).
    health = HealthMonitor(
        cfg.health,
        check_logprob_gap=r.top_p == 1.0,
        sampler_dtype=cfg.sampling_dtype,
        check_overlap=r.max_staleness > 0,
        reward_weights=dict(rewards.weights),  # component shares weigh the raw scores as the total does
        held_out=bool(cfg.eval.every and cfg.eval.suite),
        eval_every=cfg.eval.every if cfg.eval.suite else 0,  # a held-out window too short for it is said at the start
        steps=cfg.train.steps,
    )
    saved: dict[str, Any] = {
        "policy": models.lora if models.lora is not None else models.policy,
        **({"critic": critic.model} if critic is not None else {}),
    }
    optimizers = {"policy": learner.optimizer, **({"critic": critic.optimizer} if critic is not None else {})}
    checkpointer = Checkpointer(
        arm_dir, every=cfg.checkpoint.every, keep=cfg.checkpoint.keep, last_step=cfg.train.steps, models=saved, optimizers=optimizers,
        state=lambda: {"sampler": sampler.state_dict(), "health": health.state_dict(), **learner.state_dict(), "arm": arm,
                       "policy_path": str(policy_path)},
        extra=checkpoint_extra, logger=logger)  # fmt: skip
    built = Arm(
        config=cfg,
        name=arm,
        policy_path=Path(policy_path),
        tokenizer=tokenizer,
        sampler=sampler,
        health=health,
        collector=collector,
        pipeline=pipeline,
        learner=learner,
        critic=critic,
        reference=models.reference,
        checkpointer=checkpointer,
        logger=logger,
        evaluator=evaluator,
    )
    # Periodic evaluation's datasets against the training rows, where the evaluator can tell (PeriodicEvaluator).
    built.data_warnings = list(evaluator.overlap_warnings(sampler.samples)) if isinstance(evaluator, ChecksOverlap) else []
    if teacher_from is not None and teacher_from.note:  # self-distillation
        built.data_warnings.append(teacher_from.note)
    if models.padding_free_reason is not None:  # said when the loop starts, and tagged
        built.data_warnings.append(f"train.padding_free: auto is off: {models.padding_free_reason}")
    tool_note = getattr(getattr(collector, "episodes", None), "tool_note", None)
    if tool_note:  # how the episodes offer tools and parse calls (env.tool_format, env.tool_parser), said first
        built.data_warnings.append(tool_note)
    if resume:
        _restore(built)
    learner.apply_optimizer_settings()
    return built


def _log_runtime(logger: Tracker, models: Models, rollout: RolloutSide, build_started: float) -> None:
    # Start-up cost is part of "faster to a comparison": recorded per arm so it can be compared.
    policy = models.policy
    logger.log_params(
        {
            "runtime.learner_device": str(models.device),
            "runtime.host_malloc": models.host_malloc,
            "runtime.torch_threads": rollout.torch_threads,
            "runtime.rollout_threads": rollout.generate_threads,
            "runtime.cpu_matmul": models.cpu_matmul,
            "runtime.cpu_vendor": cpu_vendor() or "unknown",
            "runtime.torch_blas": torch_blas(),
            # A transformers model's config (third-party; a bare torch module has none).
            "runtime.learner_attention": policy.config._attn_implementation if hasattr(policy, "config") else "unknown",
            "runtime.padding_free": models.padding_free,
            **({"runtime.padding_free_reason": models.padding_free_reason} if models.padding_free_reason else {}),
            "runtime.engine_startup_s": round(rollout.startup_s, 2),
            "runtime.build_s": round(time.perf_counter() - build_started, 2),
        }
    )


def _pipeline_context(
    cfg: ExperimentConfig, models: Models, pad_token_id: int, *, reward_weights: dict[str, float]
) -> PipelineContext:
    r, critic, lora, estimator = cfg.rollout, models.critic, models.lora, models.estimator
    return PipelineContext(
        estimator=estimator,
        estimator_params={**estimator.default_params, **cfg.advantage.params},
        pad_token_id=pad_token_id,
        policy=models.policy,
        reference=models.reference,
        reference_scope=lora.adapter_disabled if lora is not None else None,
        values=critic.values if critic is not None else None,
        compute_dtype=models.dtype,
        micro_batch_size=cfg.train.micro_batch_size,
        temperature=r.temperature,
        max_tokens=r.max_tokens,
        reuse_old_logprobs=reuses_old_logprobs(cfg),
        overlong=cfg.advantage.overlong,
        kl_coef=cfg.train.kl_coef,
        kl_estimator=cfg.train.kl_estimator,
        kl_in_reward=cfg.train.kl_in_reward,
        tis_cap=r.truncated_importance_sampling.cap if r.truncated_importance_sampling.enabled else None,
        modalities=cfg.modalities,
        share_prompts=cfg.train.share_prompts,
        padding_free=models.padding_free,
        behaviour_logprobs=r.max_staleness > 0,
        rollout_correction=cfg.objective.rollout_correction,
        decoupled_reward_weights=reward_weights if cfg.advantage.reward_aggregation == "gdpo" else None,
        distill=cfg.distill,
    )


def _restore(built: Arm) -> None:
    """The latest checkpoint's state into the built arm (nothing when there is none)."""
    state = built.checkpointer.restore_latest()
    if state is None:
        return
    cfg, learner = built.config, built.learner
    built.sampler.load_state_dict(state["sampler"])
    built.start_step, built.start_state = int(state["step"]), state
    learner.load_state_dict(
        {
            "optimizer_step": state.get("optimizer_step", built.start_step * learner.optimizer_steps_per_step()),
            # The version of the restored weights, which the sync below gives the engine (absent: derived).
            **({"weight_version": state["weight_version"]} if "weight_version" in state else {}),
            "nonfinite": state.get("nonfinite", {}),
            "critic_nonfinite": state.get("critic_nonfinite", {}),
            "entropy": state.get("entropy", {}),  # the adapted entropy coefficient (objective.adaptive_entropy)
        }
    )
    built.health.load_state_dict(state.get("health", {}))
    # The engine was built from the base weights; it samples in rollout.dtype (else model.dtype), as every later sync.
    sync_policy(built.collector, learner, compute_dtype(cfg.sampling_dtype), adapter=adapter_sync(cfg))
