"""The seams of the training loop, one :class:`typing.Protocol` each: what the loop
(:mod:`polyrl.trainer.loop`, :mod:`polyrl.trainer.async_loop`), its hooks (:mod:`polyrl.trainer.hooks`)
and the arm (:mod:`polyrl.trainer.arm`) use of each collaborator, and nothing more.

The built roles satisfy them (:class:`~polyrl.rollout.collector.RolloutCollector`,
:class:`~polyrl.trainer.pipeline.BatchPipeline`, :class:`~polyrl.learner.policy_learner.PolicyLearner` and
:class:`~polyrl.learner.ranks.DataParallelLearner`,
:class:`~polyrl.data.sampler.PromptSampler`, :class:`~polyrl.tracking.run_logger.RunLogger`,
:class:`~polyrl.evals.periodic.PeriodicEvaluator`); tests drive the loop with small stand-ins
that satisfy them too. The hooks' own contract is the :class:`~polyrl.trainer.hooks.Hook` base
class (three no-op methods a hook overrides).

The few capabilities only some implementations have are small runtime-checkable protocols of
their own, asked with ``isinstance`` (:class:`ReleasesWeights`, :class:`ReportsWorkerMetrics`,
:class:`WorkerPool`, :class:`Closes`, :class:`CapturesTokens`, :class:`WantsLearnerTokens`,
:class:`ChecksOverlap`); an engine the learner's weights reach is a :class:`SyncedEngine`. A
:class:`~polyrl.trainer.async_loop.VersionedEngine` forwards the engine's other attributes by
``__getattr__``, which ``isinstance`` does not follow from Python 3.12 (it looks attributes up
statically), so it defines the capabilities it is asked for (``worker_metrics``) itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol, runtime_checkable

import torch
from torch import Tensor

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.engines.base import ReportsWorkerMetrics  # the collector's too, a layer below: defined there

if TYPE_CHECKING:  # annotations only: the roles import this module
    from polyrl.learner.policy_learner import LearnerSettings
    from polyrl.rollout.batches import Rollout, Scores
    from polyrl.rollout.collector import Collected, CollectSettings

__all__ = [
    "BatchSource",
    "CapturesTokens",
    "ChecksOverlap",
    "Closes",
    "Collector",
    "Engine",
    "EvalOutcome",
    "Evaluator",
    "Learner",
    "Pipeline",
    "PromptSource",
    "ReleasesWeights",
    "ReportsWorkerMetrics",
    "Rewards",
    "SyncedEngine",
    "Tracker",
    "WantsLearnerTokens",
    "WorkerPool",
]


class PromptSource(Protocol):
    """The training prompts (:class:`~polyrl.data.sampler.PromptSampler`): drawn in order, its
    position saved in every checkpoint and restored on resume."""

    def next_batch(self, num_prompts: int, step: int | None = None) -> list[PromptSample]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


BatchSource = Callable[[int], list[PromptSample]]
"""What the collector draws its prompts from: ``num_prompts`` → the next prompts."""


class Engine(Protocol):
    """The rollout engine as the loop and periodic evaluation see it (through the collector);
    :class:`~polyrl.engines.base.RolloutEngine` is the full contract, and the asynchronous loop
    wraps one in a :class:`~polyrl.trainer.async_loop.VersionedEngine`."""

    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]: ...

    def close(self) -> None: ...


class SyncedEngine(Engine, Protocol):
    """An engine the learner's weights reach (:class:`~polyrl.engines.base.RolloutEngine`): each
    update goes through the engine's weight transport (:mod:`polyrl.engines.weight_transport`) and
    sets the policy version later samples carry (default: one more than now); returns it."""

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int | None = None) -> int: ...

    def update_adapter(self, folder: str, version: int | None = None) -> int: ...


@runtime_checkable
class ReleasesWeights(Protocol):
    """An engine that can drop its weights for the update's memory peak (vLLM on CPU); the next
    sync loads them all again. Returns how many layers' weights went (0: none)."""

    def release_weights(self) -> int: ...


@runtime_checkable
class WorkerPool(Protocol):
    """A pool of rollout workers (:class:`~polyrl.engines.worker_pool.RolloutWorkerPool`), which
    the asynchronous loop splits into groups with a producer each."""

    @property
    def worker_count(self) -> int: ...

    def worker_engine(self, workers: list[int]) -> Engine:
        """These workers alone, as an engine."""
        ...


@runtime_checkable
class Closes(Protocol):
    """Holds resources until closed (a data-parallel learner's ranks and the Ray they started)."""

    def close(self) -> None: ...


class Rewards(Protocol):
    """The arm's rewards (:class:`~polyrl.rewards.CompositeReward`) as the collector and the
    asynchronous loop's producers share them."""

    @property
    def labels(self) -> list[str]: ...

    def score(self, batch: Any) -> Any: ...


class Collector(Protocol):
    """Generates and scores one step's rollout (:class:`~polyrl.rollout.collector.RolloutCollector`)
    and carries the learner's policy into its engine."""

    # A SyncedEngine where it syncs; the asynchronous loop's producers' collectors hold a
    # VersionedEngine, around some of the rollout workers where there are several.
    engine: Engine
    rewards: Rewards
    settings: CollectSettings

    def collect(self, step: int) -> Collected: ...

    def sync_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int | None = None) -> None: ...

    def sync_adapter(self, write: Callable[[Path], Any], version: int | None = None) -> None: ...

    def close(self) -> None: ...


class Pipeline(Protocol):
    """Rollout and scores → the learner's batch: advantages, old and reference log-probs,
    masks (:class:`~polyrl.trainer.pipeline.BatchPipeline`). The batch carries ``metrics``."""

    def run(self, rollout: Rollout, scores: Scores) -> Any: ...


class Learner(Protocol):
    """Updates the policy on a batch (:class:`~polyrl.learner.policy_learner.PolicyLearner`, or
    :class:`~polyrl.learner.ranks.DataParallelLearner` with ``train.learner_workers``)."""

    @property
    def settings(self) -> LearnerSettings: ...

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    def update(self, batch: Any, step_index: int = 0, weight_version: int | None = None) -> dict[str, float]:
        """One step's optimizer steps; raises :class:`~polyrl.monitoring.health.NonFiniteStop` after
        too many non-finite ones in a row, having put itself back as it was before the step.
        ``weight_version``: the policy version of the learner's weights in the rows' numbering
        (default: the learner's own, ``weight_version``, which the synchronous loop's syncs send)."""
        ...

    def weights(self, dtype: torch.dtype) -> Iterator[tuple[str, Tensor]]:
        """The policy's weights for the engine, in ``dtype`` (with LoRA: merged)."""
        ...

    def write_adapter(self, folder: Any) -> None:
        """The LoRA adapter alone into ``folder`` (``model.lora.sync: adapter``)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def optimizer_steps_per_step(self) -> int: ...

    def apply_optimizer_settings(self) -> None: ...


@runtime_checkable
class CapturesTokens(Protocol):
    """A learner that can capture its next update's per-token values for the rollout inspector
    (:class:`~polyrl.learner.policy_learner.PolicyLearner`; not the data-parallel ranks)."""

    def inspect_next_update(self) -> None: ...

    def take_inspection(self, lengths: list[int]) -> list[dict[str, list[Any]]] | None:
        """The captured values per row (``lengths``: each completion's token count), or None."""
        ...


@runtime_checkable
class WantsLearnerTokens(Protocol):
    """A hook that asks for the learner's per-token values on some steps
    (:class:`~polyrl.trainer.inspector_hook.InspectorHook`)."""

    def wants_learner_tokens(self, step: int) -> bool: ...


class Tracker(Protocol):
    """Where a run's parameters, metrics, tags and tables go
    (:class:`~polyrl.tracking.run_logger.RunLogger`, MLflow)."""

    def log_params(self, params: dict[str, Any]) -> None: ...

    def set_tags(self, tags: dict[str, Any]) -> None: ...

    def logged_steps(self) -> set[int]:
        """Steps it already holds (a resumed run recomputes them; tables are not written twice)."""
        ...

    def log_step(self, step: int, metrics: dict[str, float]) -> bool: ...

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_text(self, text: str, artifact_file: str) -> None: ...

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None: ...


class EvalOutcome(Protocol):
    """One periodic evaluation (:class:`~polyrl.evals.periodic.PeriodicResult`): its metrics
    (logged as ``eval/<name>``) and sample rows (an MLflow table)."""

    metrics: dict[str, float]
    rows: list[dict[str, Any]]


class Evaluator(Protocol):
    """Periodic evaluation with the rollout engine at a step (``eval.every``;
    :class:`~polyrl.evals.periodic.PeriodicEvaluator`)."""

    def __call__(self, engine: Any, step: int) -> EvalOutcome: ...


@runtime_checkable
class ChecksOverlap(Protocol):
    """An evaluator that can tell which of its datasets share rows with the training prompts
    (:meth:`~polyrl.evals.periodic.PeriodicEvaluator.overlap_warnings`); the warnings are said
    when the loop starts."""

    def overlap_warnings(self, training_samples: list[PromptSample]) -> list[str]: ...
