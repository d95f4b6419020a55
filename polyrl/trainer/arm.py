"""One arm of an experiment, built: its roles (sampler, collector, pipeline, learner, critic,
health checks, checkpointer), the loop :meth:`Arm.loop` assembles from them with its hooks, and
:meth:`Arm.close`. Building it from a config is :mod:`polyrl.trainer.build_arm`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import yaml

from polyrl.config.schema import ExperimentConfig, to_yaml
from polyrl.data.sampler import PromptSampler
from polyrl.learner.critic import Critic
from polyrl.monitoring.health import HealthMonitor
from polyrl.rollout.collector import RolloutCollector
from polyrl.runtime.precision import compute_dtype
from polyrl.runtime.ray_cluster import release_ray
from polyrl.tracking.replay_store import store_path
from polyrl.trainer.async_loop import AsyncTrainingLoop
from polyrl.trainer.build_rollout import adapter_sync
from polyrl.trainer.compute_counters import ComputeCounters
from polyrl.trainer.hooks import Callback, Checkpointer, HealthHook, Hook, MetricLogger, PeriodicEvalHook, SampleTableHook
from polyrl.trainer.inspector_hook import InspectorHook, ReplayStoreHook
from polyrl.trainer.loop import TrainingLoop
from polyrl.trainer.pipeline import BatchPipeline
from polyrl.trainer.protocols import Closes, Evaluator, Learner, Tracker

__all__ = ["Arm"]


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
    learner: Learner  # a PolicyLearner, or a DataParallelLearner with train.learner_workers > 1
    critic: Critic | None
    reference: torch.nn.Module | None
    checkpointer: Checkpointer
    logger: Tracker | None = None
    evaluator: Evaluator | None = None
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
            hooks.append(
                InspectorHook(
                    logger,
                    every=cfg.tracking.sample_table_every,
                    tokenizer=getattr(self.collector.engine, "tokenizer", None),
                    local_dir=self.checkpointer.arm_dir / "inspector",
                    judge_rule_pairs=cfg.health.judge_rule_pairs,
                )
            )
        if self.evaluator is not None and cfg.eval.every:
            hooks.append(PeriodicEvalHook(self.evaluator, self.collector.engine, every=cfg.eval.every, logger=logger))
        # Before the metric logger: the step's cumulative compute joins its metrics.
        hooks.append(
            ComputeCounters(
                # The model the forwards run: with LoRA the saved "policy" is the adapter (LoraPolicy, no parameters()).
                parameters=sum(
                    p.numel() for p in getattr(self.learner, "policy", self.checkpointer.models["policy"]).parameters()
                ),
                passes_per_batch=cfg.train.updates_per_batch,
                checkpointer=self.checkpointer,
                start=self.start_state.get("compute"),
            )
        )
        if logger is not None:
            hooks.append(MetricLogger(logger))
        if cfg.tracking.replay_store:
            hooks.append(ReplayStoreHook(store_path(self.checkpointer.arm_dir), self.replay_header()))
        hooks.append(self.checkpointer)
        return hooks + [Callback(fn) for fn in callbacks]

    def replay_header(self) -> dict[str, Any]:
        """The reward-replay store's header: the run, its resolved config and each reward's weight by label."""
        cfg = self.config
        weights = {"env": 1.0} if cfg.env is not None else dict(self.collector.rewards.weights)
        return {"run_id": getattr(self.logger, "run_id", None), "arm": self.name, "weights": weights,
                "config": yaml.safe_load(to_yaml(cfg))}  # fmt: skip

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
                if isinstance(self.learner, Closes):  # data-parallel learner ranks (and the Ray it started)
                    self.learner.close()
            finally:
                if self.holds_ray:
                    self.holds_ray = False
                    release_ray()
