"""Building an arm's rollout side from its config: the rollout engine (in this process, or a
pool of ``rollout.workers`` engines as Ray actors), the torch threads the learner gets back once
the engine is up and the ones generation runs with, and the collector that samples and scores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from polyrl.config.rollout import WorkerResourcesConfig
from polyrl.config.schema import ConfigError, ExperimentConfig
from polyrl.core.types import PromptSample
from polyrl.engines.base import RolloutEngine, build_rollout_engine
from polyrl.engines.kv_cache import kv_cache_request, prompt_lengths
from polyrl.envs import build_env, load_env_class
from polyrl.rewards import CompositeReward
from polyrl.rollout.collector import CollectSettings, RolloutCollector
from polyrl.rollout.episodes import EpisodeRunner, EpisodeSettings
from polyrl.runtime.devices import learner_device
from polyrl.runtime.threads import default_torch_threads, set_torch_threads
from polyrl.trainer.async_loop import VersionedEngine

__all__ = ["RolloutSide", "adapter_sync", "build_collector", "build_engine", "build_rollout", "rollout_threads"]


@dataclass
class RolloutSide:
    """What :func:`build_rollout` built and decided (recorded per arm as ``runtime.*`` parameters)."""

    engine: Any  # a RolloutEngine; a VersionedEngine around it with rollout.max_staleness
    startup_s: float  # the engine's start-up time (0 for an engine the caller passed in)
    torch_threads: int  # the learner's torch threads, set back after the engine started
    generate_threads: int  # torch threads while generating


def adapter_sync(cfg: ExperimentConfig) -> bool:
    """Whether the engine gets the LoRA adapter alone (``model.lora.sync: adapter``) rather than weights."""
    return cfg.model.lora is not None and cfg.model.lora.sync == "adapter"


def rollout_threads(configured: int | None, *, learner_threads: int) -> int:
    """torch threads while generating: ``rollout.threads``, else the learner's.

    One thread looked better for tiny policies in isolation (bench/bench_runtime_env.py), but
    inside the demo's loop it was not (two runs each, interleaved). So no size rule; the setting
    stays for users who measure their own case.
    """
    return configured if configured is not None else learner_threads


def build_engine(cfg: ExperimentConfig, policy_path: str | Path, tokenizer: Any, lengths: Iterable[int] = ()) -> RolloutEngine:
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


def build_rollout(
    cfg: ExperimentConfig,
    policy_path: Path,
    tokenizer: Any,
    samples: list[PromptSample],
    *,
    takes_images: bool,
    engine: RolloutEngine | None = None,
) -> RolloutSide:
    """The arm's engine (``engine`` if the caller passed one, else :func:`build_engine` sized for
    ``samples``), behind a :class:`VersionedEngine` for asynchronous training, and the torch
    threads once it is up."""
    started = time.perf_counter()
    if engine is None:
        lengths = prompt_lengths(samples, tokenizer, takes_images=takes_images, max_model_len=cfg.rollout.max_model_len)
        engine = build_engine(cfg, policy_path, tokenizer, lengths)
    elif cfg.rollout.workers > 1:
        raise ConfigError(
            f"rollout.workers: {cfg.rollout.workers} workers asked for, but the caller passed its own engine; "
            "set rollout.workers: 1 or pass no engine"
        )
    if cfg.rollout.max_staleness:
        engine = VersionedEngine(engine)  # one lock for the producer, the syncs and periodic evaluation (trainer/async_loop.py)
    startup_s = time.perf_counter() - started
    # vLLM drops torch to one thread "for serving"; the learner shares this process and
    # wants every core back for its forward/backward passes (or train.threads).
    threads = set_torch_threads(cfg.train.threads or default_torch_threads())
    return RolloutSide(
        engine=engine,
        startup_s=startup_s,
        torch_threads=threads,
        generate_threads=rollout_threads(cfg.rollout.threads, learner_threads=threads),
    )


def needs_greedy_baseline(cfg: ExperimentConfig) -> bool:
    """Whether the arm's advantage estimator takes a reward baseline per sample (ReMax's greedy
    completion), which the collector then generates and scores."""
    from polyrl.algos.advantages import get_advantage
    from polyrl.algos.objectives import get_objective

    name = cfg.advantage.estimator or get_objective(cfg.objective.name).default_advantage
    return "baselines" in get_advantage(name).requires


def build_collector(
    cfg: ExperimentConfig,
    engine: Any,
    rewards: CompositeReward,
    next_batch: Callable[[int], list[PromptSample]],
    *,
    accuracy_label: str | None,
    teacher: Any = None,
) -> RolloutCollector:
    """The collector: ``rollout.*`` sampling settings, DAPO dynamic sampling, the accuracy reward;
    with ``env:``, the episode runner (its return, labelled ``env``, is the reward; the accuracy is the
    environment's verdict, :func:`polyrl.envs.base.episode_accuracy_value`)."""
    r, dynamic = cfg.rollout, cfg.advantage.dynamic_sampling
    episodes = build_episodes(cfg, engine.tokenizer) if cfg.env is not None else None
    if episodes is not None:
        accuracy_label = "env"
    return RolloutCollector(
        engine,
        rewards,
        next_batch,
        CollectSettings(
            prompts_per_step=r.prompts_per_step,
            samples_per_prompt=r.samples_per_prompt,
            temperature=r.temperature,
            top_p=r.top_p,
            max_tokens=r.max_tokens,
            seed=cfg.seed,
            dynamic_sampling=dynamic.enabled,
            max_rounds=dynamic.max_rounds,
            accuracy_label=accuracy_label,
            threads=r.threads,  # None: generation keeps the learner's count, nothing to switch per call
            greedy_baseline=needs_greedy_baseline(cfg),
        ),
        episodes=episodes,
        teacher=teacher,  # distill: (trainer/build_teacher.py) scores the collected rows
    )


def build_episodes(cfg: ExperimentConfig, tokenizer: Any) -> EpisodeRunner:
    """The episode runner of ``env:`` (a fresh environment per episode)."""
    e = cfg.env
    cls = load_env_class(e.module)
    settings = EpisodeSettings(
        max_turns=e.max_turns,
        max_episode_tokens=e.max_episode_tokens,
        tool_timeout_s=e.tool_timeout_s,
        tool_output_chars=e.tool_output_chars,
        tool_sandbox=e.tool_sandbox.settings(),
        tool_format=e.tool_format,
        tool_parser=e.tool_parser,
        step_timeout_s=e.step_timeout_s,
        system_prompt=cfg.data.system_prompt,
        env_name=e.module,
        stop=tuple(e.stop),
    )
    return EpisodeRunner(lambda: build_env(cls, dict(e.params), ref=e.module), tokenizer, settings,
                         max_model_len=cfg.rollout.max_model_len)  # fmt: skip
