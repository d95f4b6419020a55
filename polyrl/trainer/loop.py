"""The training loop of one arm: collect → pipeline → learn → sync → hooks, each phase timed.

The roles it drives take and return plain data (:mod:`polyrl.rollout.batches`), and it gets them
all in its constructor (:func:`polyrl.trainer.build_arm.build_arm` builds them from a config); what it
uses of each is its protocol in :mod:`polyrl.trainer.protocols`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from typing import Any, Iterator, Sequence

import torch

from polyrl.engines.modality_marks import modality_string
from polyrl.learner.nonfinite import NONFINITE_REASONS, NonFiniteStop, NonFiniteTrainingError
from polyrl.rollout.batches import Rollout, Scores, length_metrics
from polyrl.rollout.collector import Collected
from polyrl.runtime.host_memory import release_freed_host_memory
from polyrl.tracking.inspector import sampled_token_values
from polyrl.trainer.hooks import Checkpointer, Hook, StepReport
from polyrl.trainer.protocols import (
    CapturesTokens,
    Collector,
    Learner,
    Pipeline,
    PromptSource,
    ReleasesWeights,
    WantsLearnerTokens,
)

__all__ = ["PHASES", "PhaseTimer", "TrainingLoop", "length_metrics", "rollout_metrics", "sample_rows"]

PHASES = ("generate", "score", "advantage", "update", "sync", "log")


class PhaseTimer:
    """Accumulates wall time per named phase within one step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        out = {f"perf/{phase}_s": self.seconds.get(phase, 0.0) for phase in (*PHASES, *self.seconds)}
        out["perf/step_s"] = sum(self.seconds.values())
        return out


def rollout_metrics(rollout: Rollout) -> dict[str, float]:
    """Lengths of every sample of ``rollout`` (``rollout/...``)."""
    return length_metrics(rollout.completions, "rollout")


def sample_rows(rollout: Rollout, scores: Scores) -> list[dict[str, Any]]:
    # "modalities": one letter per completion token (T text, I image), the GAE setting each got.
    return [
        {
            "prompt": p.shown_prompt,
            "completion": c.text,
            "reward": s,
            "length": c.policy_length,  # the policy's tokens (an episode's observations left out)
            "finish_reason": c.finish_reason,
            "modalities": modality_string(c.completion_token_modalities),
            # An episode turn by turn (roles, contents, tool calls, per-turn rewards, trained or not), as JSON.
            **({"episode": json.dumps(c.episode)} if c.episode is not None else {}),
        }
        for p, c, s in zip(rollout.prompts, rollout.completions, scores.totals)
    ]


def sync_policy(collector: Collector, learner: Learner, engine_dtype: torch.dtype, adapter: bool = False) -> None:
    """The learner's policy into the rollout engine: its LoRA adapter alone (``adapter``,
    ``model.lora.sync: adapter``) or its weights in the engine's dtype (with LoRA: merged), as the
    learner's weight version (``PolicyLearner.weight_version``), which every later sample carries:
    the learner then knows which rows its own weights sampled, whatever steps made no update and
    wherever a resume started."""
    version = getattr(learner, "weight_version", None)  # a learner without versions: the engine counts syncs
    extra = {} if version is None else {"version": version}
    if adapter:
        collector.sync_adapter(learner.write_adapter, **extra)
    else:
        collector.sync_weights(learner.weights(engine_dtype), **extra)


class TrainingLoop:
    def __init__(self, *, arm: str, steps: int, sampler: PromptSource, collector: Collector, pipeline: Pipeline,
                 learner: Learner, engine_dtype: torch.dtype, checkpointer: Checkpointer, hooks: Sequence[Hook] = (),
                 start_step: int = 0, history: list[dict[str, float]] | None = None, adapter_sync: bool = False):  # fmt: skip
        self.arm, self.steps = arm, steps
        self.adapter_sync = adapter_sync
        self.sampler, self.collector, self.pipeline, self.learner = sampler, collector, pipeline, learner
        self.engine_dtype = engine_dtype
        self.checkpointer = checkpointer
        self.hooks = list(hooks)
        self.step_index = start_step  # completed steps
        self.history: list[dict[str, float]] = [] if history is None else history

    def run(self) -> list[dict[str, float]]:
        self.start_hooks()
        while self.step_index < self.steps:
            self.step()
        return self.history

    def start_hooks(self) -> None:
        """Every hook's ``start``, then what they measured there (each one's ``start_metrics``: the
        step-0 evaluation) to every hook's ``started``."""
        for hook in self.hooks:
            hook.start(self.step_index)
        measured = {key: value for hook in self.hooks for key, value in hook.start_metrics.items()}
        for hook in self.hooks:
            hook.started(self.step_index, measured)

    def step(self) -> dict[str, float]:
        step, timer = self.step_index + 1, PhaseTimer()
        step_start_sampler = self.sampler.state_dict()  # where a non-finite stop resumes from
        collected = self.collector.collect(step)
        for phase, seconds in collected.seconds.items():
            timer.seconds[phase] += seconds
        # Synchronous: nothing generates until the sync, so the sampler's weights may go meanwhile.
        return self.train_on(step, collected, timer, step_start_sampler, release_sampler=not self.adapter_sync)

    def train_on(
        self,
        step: int,
        collected: Collected,
        timer: PhaseTimer,
        step_start_sampler: dict[str, Any],
        extra_metrics: dict[str, float] | None = None,
        release_sampler: bool = False,
    ) -> dict[str, float]:
        """Step ``step`` on ``collected``: pipeline, update, sync, then the hooks; ``extra_metrics``
        join the step's metrics before the hooks see them. ``release_sampler``: the rollout engine
        drops its weights for the update (the sync reloads them all; only where nothing generates
        before that sync)."""
        rollout, metrics = collected.rollout, {**collected.scores.metrics, **(extra_metrics or {})}
        if len(rollout):  # dynamic sampling may find no informative group: nothing to learn from
            with timer("advantage"):
                batch = self.pipeline.run(rollout, collected.scores)
            with timer("update"):
                self.ask_learner_tokens(step)
                released = self.free_memory_for_update(release_sampler)
                try:
                    learned = self.learn(batch, step_start_sampler)
                except Exception:
                    if released:  # the engine samples again, with the weights the learner put itself back to
                        self.sync()
                    raise
            with timer("sync"):
                release_freed_host_memory()  # what the update freed, before the sync rebuilds the sampler
                self.sync()
            metrics.update({**batch.metrics, **learned})
        # rollout/...: every generated sample (the collector's, over all dynamic-sampling rounds),
        # as reward/* and train/accuracy are; train/...: the samples kept for the update. Without
        # dynamic sampling they agree; with it the kept groups are a biased subset (no all-right
        # or all-wrong group), so two identical policies would otherwise show different lengths.
        metrics.update(length_metrics(rollout.completions, "train"))
        if "rollout/samples" not in metrics:  # a collector that reports no lengths of its own
            metrics.update(rollout_metrics(rollout))
        self.step_index = step
        learned_tokens = (
            self.learner.take_inspection([len(c.completion_ids) for c in rollout.completions])
            if isinstance(self.learner, CapturesTokens)
            else None
        )
        report = StepReport(
            step,
            metrics,
            sample_rows(rollout, collected.scores),
            prompts=list(rollout.prompts),
            reward_parts=dict(collected.scores.per_module),
            # The learner's per-token values (learner/token_capture.py) on the steps that asked for them.
            tokens=[
                {
                    **sampled_token_values(c),  # None on an episode's observation tokens (not sampled)
                    **(learned_tokens[i] if learned_tokens else {}),
                }
                for i, c in enumerate(rollout.completions)
            ],
            group_ids=rollout.group_ids.tolist(),
        )
        # The weight sync's share of the step so far: polyrl's own measure of the cost of communication
        # between learner and sampler (checked in asynchronous training).
        metrics["perf/sync_share"] = timer.seconds.get("sync", 0.0) / max(sum(timer.seconds.values()), 1e-9)
        with timer("log"):
            metrics["train/samples_per_s"] = len(rollout) / max(sum(timer.seconds.values()), 1e-9)
            for hook in self.hooks:
                hook.observe(report)
        metrics.update(timer.metrics())  # perf/log_s: everything in "log" but the final write
        for hook in self.hooks:
            hook.publish(report)
        self.history.append(metrics)
        return metrics

    def ask_learner_tokens(self, step: int) -> None:
        """The learner captures per-token values in this update where a hook (the rollout inspector)
        wants them for ``step`` and the learner can (PolicyLearner; not the data-parallel ranks)."""
        wanted = any(isinstance(hook, WantsLearnerTokens) and hook.wants_learner_tokens(step) for hook in self.hooks)
        if wanted and isinstance(self.learner, CapturesTokens):
            self.learner.inspect_next_update()

    def free_memory_for_update(self, release_sampler: bool) -> bool:
        """Before the update, the step's peak: the sampler's weights go (``release_sampler``, an
        engine with ``release_weights``; vLLM on CPU), then the host memory freed since the last
        update that glibc still holds (runtime/host_memory.py). Returns whether weights went."""
        # Only some engines can (protocols.ReleasesWeights); the asynchronous loop, whose engine is a
        # VersionedEngine, never asks (its producers generate during the update).
        engine = self.collector.engine
        released = bool(engine.release_weights()) if release_sampler and isinstance(engine, ReleasesWeights) else False
        release_freed_host_memory()
        return released

    def learner_update(self, batch: Any) -> dict[str, float]:
        """The learner's update on ``batch``; it compares the rows' policy versions with its own
        weight version, the number :func:`sync_policy` gave the engine."""
        return self.learner.update(batch, self.step_index)

    def learn(self, batch: Any, step_start_sampler: dict[str, Any]) -> dict[str, float]:
        try:
            return self.learner_update(batch)
        except NonFiniteStop as stop:
            # The checkpoint is of a whole step, never of part of one. No optimizer step of this
            # update applied: the learner is as after the previous step, saved with the data
            # position of this step's start, which a resume repeats. Some applied (the guard ran
            # out later in the update): the learner skipped the rest, so this step is done with
            # them skipped, as a step with a few skipped non-finite steps always is; it is saved
            # as this step, with the data position after it.
            # A resume after the user's fix starts a fresh count of consecutive skips.
            what = NONFINITE_REASONS[stop.reason]
            fresh = {"nonfinite": {"consecutive": 0}}
            if "critic_nonfinite" in self.learner.state_dict():
                fresh["critic_nonfinite"] = {"consecutive": 0}
            stopped = {"stopped": f"non-finite {what}", **fresh}
            if stop.applied_steps:
                saved_step = self.step_index + 1
                path = self.checkpointer.save(saved_step, extra=stopped)
                kept = (
                    f"Step {saved_step} is saved as done in {path}: its first {stop.applied_steps} optimizer step(s) "
                    "applied, the rest skipped"
                )
            else:
                path = self.checkpointer.save(self.step_index, extra={**stopped, "sampler": step_start_sampler})
                kept = f"The last good weights are saved in {path}"
            raise NonFiniteTrainingError(
                f"arm {self.arm!r}: training stopped in step {self.step_index + 1}: {stop.consecutive} optimizer steps in a row had "
                f"a non-finite (NaN/inf) {what} and were skipped (train.max_consecutive_nonfinite = "
                f"{self.learner.settings.max_consecutive_nonfinite}). {kept}. Check the "
                "rewards and advantages for NaN/inf, lower train.learning_rate, then resume with --resume."
            ) from None

    def sync(self) -> None:
        """Push the policy to the rollout engine: its weights in the engine's dtype (rollout.dtype, else
        model.dtype), or its LoRA adapter (model.lora.sync: adapter)."""
        sync_policy(self.collector, self.learner, self.engine_dtype, adapter=self.adapter_sync)
