"""Set-up of one arm from its config: builds each role explicitly, restores a checkpoint, and
assembles the loop with its hooks. Every decision that reads the config lives here, so the
roles themselves only see their own settings.
"""

from __future__ import annotations

import functools
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from transformers import AutoTokenizer

from polyrl.algos.advantages import get_advantage
from polyrl.algos.objectives import get_objective
from polyrl.config.schema import ConfigError, ExperimentConfig
from polyrl.data.chat import ChatFormat, format_prompts
from polyrl.data.image_rows import ImageCheck, check_model_takes_images
from polyrl.data.prompts import PromptSampler, load_prompt_dataset, rows_to_prompt_samples
from polyrl.engines.base import RolloutEngine, build_rollout_engine
from polyrl.engines.image_prompts import auto_model_class, model_takes_images
from polyrl.engines.kv_cache import kv_cache_request, prompt_lengths
from polyrl.modeling.attention import attend_in_fp32_on_cpu
from polyrl.modeling.gradient_checkpointing import GradientCheckpointingError, checkpoint_layers
from polyrl.modeling.logprobs import logit_scaling
from polyrl.modeling.lora import add_lora
from polyrl.modeling.packing import PaddingFreeError, padding_free_refusal, use_packed_rows_attention
from polyrl.modeling.shared_prompts import SharePromptsError, sharing_refusal
from polyrl.policies.paths import resolve_policy_path
from polyrl.rewards import CompositeReward, load_reward_class
from polyrl.roles.async_loop import AsyncTrainingLoop, VersionedEngine
from polyrl.roles.collector import CollectSettings, RolloutCollector
from polyrl.roles.critic import Critic, CriticSettings, build_value_model
from polyrl.roles.health import HealthMonitor
from polyrl.roles.hooks import Callback, Checkpointer, HealthHook, Hook, MetricLogger, PeriodicEvalHook, SampleTableHook
from polyrl.roles.learner import LearnerSettings, PolicyLearner
from polyrl.roles.learner_ranks import RankRecipe, start_data_parallel_learner
from polyrl.roles.loop import TrainingLoop, sync_policy
from polyrl.roles.pipeline import BatchPipeline, PipelineContext
from polyrl.runtime.compiled import check_sampler_compile, compile_decoder_layers
from polyrl.runtime.cpu_matmul import cpu_vendor, resolve_cpu_matmul, route_linears_through_onednn, torch_blas
from polyrl.runtime.devices import learner_device
from polyrl.runtime.host_memory import keep_freed_host_memory
from polyrl.runtime.precision import compute_dtype
from polyrl.runtime.ray_cluster import RayDemand, acquire_ray, release_ray
from polyrl.runtime.threads import set_torch_threads

__all__ = ["Arm", "accuracy_label", "build_arm", "reward_specs", "seed_everything"]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def reward_specs(
    config: ExperimentConfig, policy_path: str | Path, training_references: list[list[str]] | None = None
) -> list[Any]:
    """The reward specs, with the policy's folder for a reward that declares it scores with it
    (``policy_path_param`` on its class, e.g. ``ppl_fluency``'s ``model_path``) and was given none,
    and the training prompts' references for one that declares a corpus parameter
    (``training_references_param``, e.g. ``cider``'s ``corpus_references``) and was given none."""
    specs = []
    for spec in config.rewards:
        cls = load_reward_class(spec.module)
        param = getattr(cls, "policy_path_param", None)
        if param and param not in spec.params:
            spec = spec.model_copy(update={"params": {**spec.params, param: str(policy_path)}})
        corpus = getattr(cls, "training_references_param", None)
        if corpus and corpus not in spec.params and training_references:
            spec = spec.model_copy(
                update={"params": {**spec.params, corpus: [list(refs) for refs in training_references if refs]}}
            )
        specs.append(spec)
    return specs


def accuracy_label(config: ExperimentConfig, labels: list[str]) -> str | None:
    """The reward that defines ``train/accuracy``: ``tracking.accuracy_reward``, else the one
    labelled ``accuracy`` (the field's documented default), else none (no accuracy metric)."""
    wanted = config.tracking.accuracy_reward
    if wanted is None:
        return "accuracy" if "accuracy" in labels else None
    if wanted not in labels:
        raise ConfigError(f"tracking.accuracy_reward: no reward is labelled {wanted!r}; reward labels: {', '.join(labels)}")
    return wanted


def resolve_padding_free(
    setting: bool | str, policy: torch.nn.Module, *, takes_images: bool, share_prompts: bool, compile: bool
) -> bool:
    """``train.padding_free`` for this policy: true is refused where it cannot apply, 'auto' is on
    exactly where it can (:mod:`polyrl.modeling.packing`)."""
    if setting is False:
        return False
    scaling = logit_scaling(policy)
    refusal = (
        "share_prompts packs the rows its own way"
        if share_prompts
        else "compiled decoder layers (train.compile) would recompile for every packed length"
        if compile
        else f"{type(policy).__name__} scales its logits after the head ({', '.join(scaling)})"
        if scaling
        else padding_free_refusal(policy, takes_images=takes_images)
    )
    if refusal is None:
        return True
    if setting is True:
        raise PaddingFreeError(f"train.padding_free: {refusal}; set it to false or auto")
    return False


def _learner_settings(cfg: ExperimentConfig, objective: Any, padding_free: bool = False) -> LearnerSettings:
    t = cfg.train
    return LearnerSettings(
        aggregation=cfg.objective.aggregation or objective.default_aggregation,
        objective_params={**objective.default_params, **cfg.objective.params}, learning_rate=t.learning_rate, betas=tuple(t.betas),
        weight_decay=t.weight_decay, lr_schedule=t.lr_schedule, warmup_steps=t.warmup_steps, min_lr_ratio=t.min_lr_ratio,
        total_steps=t.steps, updates_per_batch=t.updates_per_batch, mini_batches=t.mini_batches, micro_batch_size=t.micro_batch_size,
        micro_batch_tokens=t.micro_batch_tokens, share_prompts=t.share_prompts, padding_free=padding_free,
        max_grad_norm=t.max_grad_norm, max_consecutive_nonfinite=t.max_consecutive_nonfinite, temperature=cfg.rollout.temperature,
        max_tokens=cfg.rollout.max_tokens, kl_coef=0.0 if t.kl_in_reward else t.kl_coef, kl_estimator=t.kl_estimator,
        entropy_coef=t.entropy_coef, seed=cfg.seed, compute_dtype=compute_dtype(cfg.model.dtype),
    )  # fmt: skip


def _critic_settings(cfg: ExperimentConfig) -> CriticSettings:
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


@dataclass
class Arm:
    """One arm's roles, checkpointer and start state; :meth:`loop` assembles the loop."""

    config: ExperimentConfig
    name: str
    policy_path: Path
    tokenizer: Any
    sampler: PromptSampler
    health: HealthMonitor
    collector: RolloutCollector
    pipeline: BatchPipeline
    learner: PolicyLearner
    critic: Critic | None
    reference: torch.nn.Module | None
    checkpointer: Checkpointer
    logger: Any | None = None
    evaluator: Callable[[Any, int], Any] | None = None
    start_step: int = 0
    start_state: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    # Said when the loop starts (health hook): e.g. eval rows that are also training rows.
    data_warnings: list[str] = field(default_factory=list)
    holds_ray: bool = False  # build_arm acquired Ray for the run's actors (ray_demand); close releases it

    def hooks(
        self, *, printer: Callable[[str], None] = print, callbacks: Sequence[Callable[[int, dict[str, float]], None]] = ()
    ) -> list[Hook]:
        cfg, logger = self.config, self.logger
        hooks: list[Hook] = [HealthHook(self.health, arm=self.name, printer=printer, logger=logger, notes=self.data_warnings)]
        if logger is not None:
            hooks.append(
                SampleTableHook(
                    logger,
                    every=cfg.tracking.sample_table_every,
                    rows=cfg.tracking.sample_table_rows,
                    answer_field=cfg.data.answer_field,
                )
            )
        if self.evaluator is not None and cfg.eval.every:
            hooks.append(PeriodicEvalHook(self.evaluator, self.collector.engine, every=cfg.eval.every, logger=logger))
        if logger is not None:
            hooks.append(MetricLogger(logger))
        hooks.append(self.checkpointer)
        return hooks + [Callback(fn) for fn in callbacks]

    def loop(
        self,
        *,
        printer: Callable[[str], None] = print,
        callbacks: Sequence[Callable[[int, dict[str, float]], None]] = (),
        max_staleness: int | None = None,
    ) -> TrainingLoop:
        """The arm's loop: asynchronous when ``max_staleness`` (default rollout.max_staleness) is set;
        an explicit 0 runs the asynchronous machinery in lock-step (tests compare it with the plain loop)."""
        k = self.config.rollout.max_staleness if max_staleness is None else max_staleness
        loop_class = functools.partial(AsyncTrainingLoop, max_staleness=k) if k or max_staleness is not None else TrainingLoop
        return loop_class(
            arm=self.name,
            steps=self.config.train.steps,
            sampler=self.sampler,
            collector=self.collector,
            pipeline=self.pipeline,
            learner=self.learner,
            engine_dtype=compute_dtype(self.config.sampling_dtype),
            checkpointer=self.checkpointer,
            hooks=self.hooks(printer=printer, callbacks=callbacks),
            start_step=self.start_step,
            history=self.history,
            adapter_sync=adapter_sync(self.config),
        )

    def close(self) -> None:
        try:
            self.collector.close()
        finally:
            try:
                if hasattr(self.learner, "close"):  # data-parallel learner ranks (and the Ray it started)
                    self.learner.close()
            finally:
                if self.holds_ray:
                    self.holds_ray = False
                    release_ray()


def adapter_sync(cfg: ExperimentConfig) -> bool:
    """Whether the engine gets the LoRA adapter alone (``model.lora.sync: adapter``) rather than weights."""
    return cfg.model.lora is not None and cfg.model.lora.sync == "adapter"


def chat_format(cfg: ExperimentConfig) -> ChatFormat:
    """How the training prompts are formatted (:mod:`polyrl.data.chat`)."""
    return ChatFormat(cfg.data.chat_template, cfg.data.system_prompt, cfg.data.messages_field)


def training_rows(cfg: ExperimentConfig) -> list[Any]:
    """The training split's prompts as the data gives them (chat rows may carry messages instead
    of a prompt); every row's images are checked and decoded."""
    data = cfg.data
    fields = dict(
        prompt_field=data.prompt_field,
        answer_field=data.answer_field,
        references_field=data.references_field,
        images_field=data.images_field,
        messages_field=chat_format(cfg).rows_messages_field,
    )
    dataset = load_prompt_dataset(
        data.source,
        data.train_split,
        limit=data.limit,
        holdout=data.holdout,
        images=ImageCheck(max_pixels=data.max_image_pixels),
        **fields,
    )
    return rows_to_prompt_samples(dataset, max_image_pixels=data.max_image_pixels, **fields)


def bf16_learner_attends_in_fp32(model: torch.nn.Module, dtype: torch.dtype) -> bool:
    """A learner model computing in bf16 on CPU runs its attention kernel in fp32
    (:mod:`polyrl.modeling.attention`: torch's CPU flash-attention backward is ~6x slower in bf16)."""
    if dtype == torch.float32 or next(model.parameters()).device.type != "cpu":
        return False
    return attend_in_fp32_on_cpu(model)


def rollout_threads(configured: int | None, *, learner_threads: int) -> int:
    """torch threads while generating: ``rollout.threads``, else the learner's.

    One thread looked better for tiny policies in isolation (0.3M: 22.6k tok/s vs 18.5k on two
    cores, bench/bench_runtime_env.py), but inside the demo's loop it was not: 66.4 s vs 62.3 s
    for both arms (two runs each, interleaved). So no size rule; the setting stays for users
    who measure their own case.
    """
    return configured if configured is not None else learner_threads


def build_rollout(cfg: ExperimentConfig, policy_path: str | Path, tokenizer: Any, lengths: Iterable[int] = ()) -> RolloutEngine:
    """The configured rollout engine: in this process (``rollout.workers: 1``), else a pool of
    ``rollout.workers`` engines as Ray actors (:mod:`polyrl.engines.worker_pool`); ``lengths``: the
    training prompts' (``rollout.kv_cache_gb: auto``, engines/kv_cache.py)."""
    r = cfg.rollout
    kv_cache = kv_cache_request(
        r.kv_cache_gb,
        sequences=r.prompts_per_step * r.samples_per_prompt,
        max_tokens=r.max_tokens,
        prompt_lengths=lengths,
        periodic_eval=bool(cfg.eval.every),
    )
    options = dict(
        seed=cfg.seed,
        dtype=cfg.sampling_dtype,
        max_model_len=r.max_model_len,
        **kv_cache,
        enforce_eager=not r.compile,
        **({"lora_rank": cfg.model.lora.r} if adapter_sync(cfg) else {}),
    )
    if r.workers == 1:
        return build_rollout_engine(r.engine, str(policy_path), **options)
    if adapter_sync(cfg):  # the adapter folder is written on the driver's disk, which workers on other nodes cannot read
        raise ConfigError(
            f"model.lora.sync: adapter is not supported with rollout.workers: {r.workers}; allowed there: "
            "model.lora.sync: merged (the workers then get merged weights)"
        )
    from polyrl.config.rollout import WorkerResourcesConfig
    from polyrl.engines.weight_broadcast import resolve_weight_sync
    from polyrl.engines.worker_pool import RolloutWorkerPool, WorkerSpec

    resources = r.worker_resources or WorkerResourcesConfig()
    sync, backend = resolve_weight_sync(
        r.weight_sync, learner_cuda=learner_device(cfg.train.device).type == "cuda", worker_gpus=resources.num_gpus
    )
    spec = WorkerSpec(
        r.engine,
        str(policy_path),
        options,
        num_cpus=resources.num_cpus,
        num_gpus=resources.num_gpus,
        placement_strategy=resources.placement_strategy,
        max_restarts=resources.max_restarts,
        ready_timeout_s=resources.ready_timeout_s,
        weight_sync=sync,
        broadcast_backend=backend or "gloo",
    )
    return RolloutWorkerPool(spec, r.workers, seed=cfg.seed, tokenizer=tokenizer)


def ray_demand(cfg: ExperimentConfig, *, rollout_workers: bool = True) -> RayDemand:
    """What the arm reserves on the Ray cluster: rollout workers, learner ranks (one CPU per
    ``train.threads``, a GPU each on CUDA), remote reward actors (runtime/ray_cluster.py)."""
    parts = []
    r, t = cfg.rollout, cfg.train
    if r.workers > 1 and rollout_workers:
        from polyrl.config.rollout import WorkerResourcesConfig

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
    logger: Any | None = None,
    evaluator: Any | None = None,
    checkpoint_extra: dict[str, Any] | None = None,
    resume: bool = False,
    engine: RolloutEngine | None = None,
) -> Arm:
    """Build models, engine, data and rewards into roles; restore the latest checkpoint if ``resume``.

    ``engine`` replaces the configured rollout engine (its caller closes nothing: :meth:`Arm.close` does).
    A run with Ray actors first acquires Ray for all of them (:func:`ray_demand`): a local cluster
    sized for them, or a refusal naming them when the cluster is too small in all.
    """
    demand = ray_demand(config, rollout_workers=engine is None)
    if not demand.parts:
        return _build_arm(
            config,
            arm=arm,
            arm_dir=arm_dir,
            logger=logger,
            evaluator=evaluator,
            checkpoint_extra=checkpoint_extra,
            resume=resume,
            engine=engine,
        )
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
        )
    except BaseException:
        release_ray()
        raise
    built.holds_ray = True
    return built


def _build_arm(
    config: ExperimentConfig,
    *,
    arm: str,
    arm_dir: str | Path,
    logger: Any | None,
    evaluator: Any | None,
    checkpoint_extra: dict[str, Any] | None,
    resume: bool,
    engine: RolloutEngine | None,
) -> Arm:
    cfg = config
    build_started = time.perf_counter()
    if cfg.train.threads:
        set_torch_threads(cfg.train.threads)
    seed_everything(cfg.seed)
    # The data (every row's images decoded) before any model is built or loaded: a bad row costs seconds.
    data = cfg.data
    samples = training_rows(cfg)
    policy_path = resolve_policy_path(cfg.model)
    check_model_takes_images(policy_path, samples, images_field=data.images_field)
    tokenizer = AutoTokenizer.from_pretrained(str(policy_path))
    # Chat prompts are formatted here, once, with the policy's tokenizer (data/chat.py).
    sampler = PromptSampler(format_prompts(samples, tokenizer, chat_format(cfg), model=str(policy_path)), seed=cfg.seed)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    dtype = compute_dtype(cfg.model.dtype)
    # fp32 master weights and optimizer state; model.dtype is the compute dtype (runtime/precision.py).
    # Image-text models load whole (AutoModelForImageTextToText): the learner's forward needs the vision tower.
    device = learner_device(cfg.train.device)
    host_malloc = keep_freed_host_memory() if device.type == "cpu" else "unchanged: the learner is on a GPU"
    policy = auto_model_class(policy_path).from_pretrained(str(policy_path), dtype=torch.float32).to(device)
    bf16_learner_attends_in_fp32(policy, dtype)
    takes_images = model_takes_images(policy_path)
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
    padding_free = resolve_padding_free(
        cfg.train.padding_free,
        policy,
        takes_images=takes_images,
        share_prompts=cfg.train.share_prompts,
        compile=cfg.train.compile,
    )
    if cfg.train.compile:
        compile_decoder_layers(policy, takes_images=takes_images)
    if cfg.rollout.compile and engine is None:
        check_sampler_compile(takes_images=takes_images)
    reference = None
    if cfg.train.kl_coef > 0 and lora is not None:
        reference = policy  # the KL reference is the base model: this policy with its adapter off (pipeline's reference_scope)
    elif cfg.train.kl_coef > 0:
        # Same storage dtype and autocast as the policy: KL is exactly 0 before the first update.
        reference = auto_model_class(policy_path).from_pretrained(str(policy_path), dtype=torch.float32).to(device).eval()
        reference.requires_grad_(False)
        bf16_learner_attends_in_fp32(reference, dtype)
    for model in (policy, reference) if padding_free else ():
        if model is not None:
            use_packed_rows_attention(model)  # the attention wrapper: per-row on packed forwards, unchanged on padded ones
    objective = get_objective(cfg.objective.name)
    estimator = get_advantage(cfg.advantage.estimator or objective.default_advantage)
    critic = (
        Critic(build_value_model(policy_path, torch.float32).to(device), _critic_settings(cfg))
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
    learner = PolicyLearner(policy, objective, _learner_settings(cfg, objective, padding_free), critic=critic, lora=lora)
    if cfg.train.learner_workers > 1:  # this learner becomes the driver's mirror of rank 0 (roles/learner_ranks.py)
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
    rewards = CompositeReward(reward_specs(cfg, policy_path, [sample.references for sample in sampler.samples]))
    rewards.setup()
    label = accuracy_label(cfg, rewards.labels)
    engine_started = time.perf_counter()
    if engine is None:
        lengths = prompt_lengths(sampler.samples, tokenizer, takes_images=takes_images, max_model_len=cfg.rollout.max_model_len)
        engine = build_rollout(cfg, policy_path, tokenizer, lengths)
    elif cfg.rollout.workers > 1:
        raise ConfigError(
            f"rollout.workers: {cfg.rollout.workers} workers asked for, but the caller passed its own engine; "
            "set rollout.workers: 1 or pass no engine"
        )
    if cfg.rollout.max_staleness:
        engine = VersionedEngine(engine)  # one lock for the producer, the syncs and periodic evaluation (roles/async_loop.py)
    engine_startup_s = time.perf_counter() - engine_started
    # vLLM drops torch to one thread "for serving"; the learner shares this process and
    # wants every core back for its forward/backward passes (or train.threads).
    threads = set_torch_threads(cfg.train.threads or os.cpu_count() or 1)
    generate_threads = rollout_threads(cfg.rollout.threads, learner_threads=threads)
    if logger is not None:
        # Start-up cost is part of "faster to a comparison": recorded per arm so it can be compared.
        logger.log_params(
            {
                "runtime.learner_device": str(device),
                "runtime.host_malloc": host_malloc,
                "runtime.torch_threads": threads,
                "runtime.rollout_threads": generate_threads,
                "runtime.cpu_matmul": cpu_matmul,
                "runtime.cpu_vendor": cpu_vendor() or "unknown",
                "runtime.torch_blas": torch_blas(),
                "runtime.learner_attention": policy.config._attn_implementation if hasattr(policy, "config") else "unknown",
                "runtime.padding_free": padding_free,
                "runtime.engine_startup_s": round(engine_startup_s, 2),
                "runtime.build_s": round(time.perf_counter() - build_started, 2),
            }
        )
    r, dynamic = cfg.rollout, cfg.advantage.dynamic_sampling
    collector = RolloutCollector(
        engine,
        rewards,
        sampler.next_batch,
        CollectSettings(
            prompts_per_step=r.prompts_per_step,
            samples_per_prompt=r.samples_per_prompt,
            temperature=r.temperature,
            top_p=r.top_p,
            max_tokens=r.max_tokens,
            seed=cfg.seed,
            dynamic_sampling=dynamic.enabled,
            max_rounds=dynamic.max_rounds,
            accuracy_label=label,
            threads=cfg.rollout.threads,
        ),
    )  # None: generation keeps the learner's count, nothing to switch per call
    pipeline = BatchPipeline(
        PipelineContext(
            estimator=estimator,
            estimator_params={**estimator.default_params, **cfg.advantage.params},
            pad_token_id=pad_token_id,
            policy=policy,
            reference=reference,
            reference_scope=lora.adapter_disabled if lora is not None else None,
            values=critic.values if critic is not None else None,
            compute_dtype=dtype,
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
            padding_free=padding_free,
            behaviour_logprobs=r.max_staleness > 0,
        )
    )
    # Asynchronous training: the sampler/learner gap includes the staleness, so it is no sync check.
    health = HealthMonitor(
        cfg.health,
        check_logprob_gap=r.top_p == 1.0 and not r.max_staleness,
        sampler_dtype=cfg.sampling_dtype,
        check_overlap=r.max_staleness > 0,
    )
    models: dict[str, Any] = {
        "policy": lora if lora is not None else policy,
        **({"critic": critic.model} if critic is not None else {}),
    }
    optimizers = {"policy": learner.optimizer, **({"critic": critic.optimizer} if critic is not None else {})}
    checkpointer = Checkpointer(
        arm_dir, every=cfg.checkpoint.every, keep=cfg.checkpoint.keep, last_step=cfg.train.steps, models=models, optimizers=optimizers,
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
        reference=reference,
        checkpointer=checkpointer,
        logger=logger,
        evaluator=evaluator,
    )
    overlap = getattr(evaluator, "overlap_warnings", None)  # periodic evaluation's datasets against the training rows
    built.data_warnings = list(overlap(sampler.samples)) if overlap is not None else []
    state = checkpointer.restore_latest() if resume else None
    if state is not None:
        sampler.load_state_dict(state["sampler"])
        built.start_step, built.start_state = int(state["step"]), state
        learner.load_state_dict(
            {
                "optimizer_step": state.get("optimizer_step", built.start_step * learner.optimizer_steps_per_step()),
                "nonfinite": state.get("nonfinite", {}),
                "critic_nonfinite": state.get("critic_nonfinite", {}),
            }
        )
        health.load_state_dict(state.get("health", {}))
        # The engine was built from the base weights; it samples in rollout.dtype (else model.dtype), as every later sync.
        sync_policy(collector, learner, compute_dtype(cfg.sampling_dtype), adapter=adapter_sync(cfg))
    learner.apply_optimizer_settings()
    return built
