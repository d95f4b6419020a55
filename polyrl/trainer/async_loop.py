"""Asynchronous, off-policy training (``rollout.max_staleness: k`` ≥ 1): a producer thread
generates and scores the batches of steps s+1 … s+k while the learner updates on step s.

- Versions: the policy version is the number of completed training steps; the engine's weights
  carry the version of their last sync (:class:`VersionedEngine`), and every sample is stamped
  with the version that sampled it (``Completion.policy_version``).
- Staleness bound, by throttling: the producer starts step t only once the engine holds version
  ≥ t − 1 − k, and step t trains at version t − 1, so no sample is more than k versions old and
  none is ever dropped. The learner checks the bound on every batch and refuses a violation.
- Engine locks: generation (a producer's, and periodic evaluation's) and weight syncs (the
  learner's, between updates) never interleave: a sync takes the engine's lock and every
  partition's; a producer takes its partition's, evaluation the engine's.
- The buffer holds finished batches in partitions of the rollout workers (``rollout.workers``;
  one partition with the in-process engine): min(N, k + 1) partitions, each a group of workers
  with a producer thread of its own collecting whole steps into it, step t in partition
  (t − 1) mod P; the learner draws step t from that partition (:mod:`polyrl.trainer.async_partitions`).
  The producers draw their prompts in step order, so every step gets the prompts and seeds it
  gets with one engine.
- The ratio's π_old is the behaviour policy: the pipeline reads the sampler's log-probs
  (:func:`polyrl.trainer.pipeline.behaviour_logprobs`), so clipping and BAPO's bounds see the real
  staleness; with truncated importance sampling the TIS weight carries it instead (decoupled PPO).
- Episodes (``env:``): the producers play them (each turn one call on their partition's engine).
  A sync may land between two turns, so later turns can come from newer weights: an episode
  carries its first turn's version (the oldest, so the bound is never understated), and each
  policy token keeps the log-prob of the weights that sampled it, which is the π_old read here.
- Resume: a checkpoint records the sampler position after the last *consumed* batch (the
  producer has drawn further) and the steps that were in flight; a resume regenerates those, so
  no prompt is lost or repeated.

With k = 0 the producer waits for each sync before generating, which is the synchronous loop
step for step (``test_async_loop`` checks bit-equal parameters); the arm runs the plain
:class:`~polyrl.trainer.loop.TrainingLoop` for k = 0 all the same. Runs with k ≥ 1 are not
bit-reproducible: which version sampled a batch depends on timing (the versions are logged).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.rollout.collector import Collected, RolloutCollector
from polyrl.trainer.async_partitions import DrawsClosed, LockedRewards, OrderedDraws, partition_of, worker_groups
from polyrl.trainer.loop import PhaseTimer, TrainingLoop, sync_policy
from polyrl.trainer.protocols import Engine, ReportsWorkerMetrics, WorkerPool

__all__ = ["AsyncTrainingLoop", "BufferedBatch", "RolloutBuffer", "VersionedEngine", "staleness_metrics"]


class VersionedEngine:
    """A rollout engine behind one lock, with the policy version of its weights; each generated
    completion is stamped with it. Other attributes pass through to the engine.

    A pool of rollout workers (``worker_engine``/``worker_count``, engines/worker_pool.py) can be
    split (:meth:`split`) into one :class:`VersionedEngine` per group of workers
    (:attr:`partitions`, each with its own lock) for the partitions' producers; a sync holds every
    lock and sets every version."""

    def __init__(self, engine: Engine, version: int = 0):
        self.engine = engine
        self.version = version
        self.lock = threading.Lock()
        self.lock_wait_s = 0.0  # time generate calls waited for a sync (or an evaluation) to finish
        self.partitions: list[VersionedEngine] = [self]

    def split(self, max_staleness: int) -> None:
        """One partition per group of workers (:func:`~polyrl.trainer.async_partitions.worker_groups`);
        an engine that is not a pool of several workers stays one partition."""
        pool = self.engine if isinstance(self.engine, WorkerPool) else None
        groups = worker_groups(pool.worker_count if pool is not None else 1, max_staleness)
        self.partitions = (
            [self] if pool is None or len(groups) <= 1 else [VersionedEngine(pool.worker_engine(g), self.version) for g in groups]
        )

    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]:
        asked = time.perf_counter()
        with self.lock:
            self.lock_wait_s += time.perf_counter() - asked
            version = self.version
            grouped = self.engine.generate(prompts, settings)
        for completions in grouped:
            for completion in completions:
                completion.policy_version = version
        return grouped

    @contextlib.contextmanager
    def syncing(self, version: int) -> Iterator[float]:
        """Hold the lock while the body loads new weights (or an adapter) into the engine, then
        record ``version`` as theirs, so no sample is stamped with a version its weights are not.
        Yields the seconds spent waiting for the lock (a generation in progress: no communication)."""
        asked = time.perf_counter()
        with self.lock, contextlib.ExitStack() as partition_locks:
            for part in self._other_partitions():
                partition_locks.enter_context(part.lock)
            yield time.perf_counter() - asked
            for engine in (self, *self._other_partitions()):
                engine.version = version

    def advance(self, version: int) -> None:
        """A step that made no update: the weights are those of ``version`` as they are."""
        with self.lock, contextlib.ExitStack() as partition_locks:
            for part in self._other_partitions():
                partition_locks.enter_context(part.lock)
            for engine in (self, *self._other_partitions()):
                engine.version = max(engine.version, version)

    def _other_partitions(self) -> list["VersionedEngine"]:
        return [part for part in self.partitions if part is not self]

    def worker_metrics(self) -> dict[str, float]:
        """The wrapped engine's rollout-worker counters ({} without workers). Defined here, not
        forwarded, so that ``isinstance(…, ReportsWorkerMetrics)`` holds on every Python."""
        return self.engine.worker_metrics() if isinstance(self.engine, ReportsWorkerMetrics) else {}

    def close(self) -> None:
        self.engine.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


@dataclass
class BufferedBatch:
    step: int
    collected: Collected
    sampler_before: dict[str, Any]  # the prompt sampler's position before this step's draws
    sampler_after: dict[str, Any]  # ... and after them: what a checkpoint of this step records
    engine_wait_s: float  # the producer's wait for newer weights (throttle and engine lock)
    partition: int = 0  # the buffer partition (group of rollout workers) that collected it


class RolloutBuffer:
    """Finished batches by step, in ``partitions`` (one per group of rollout workers; step t in
    partition :func:`~polyrl.trainer.async_partitions.partition_of`), and the newest synced policy
    version the producers throttle on; a producer error reaches the learner's next :meth:`take`."""

    def __init__(self, max_staleness: int, version: int, partitions: int = 1):
        self.slots = max(max_staleness, 1)  # the k batches generation may run ahead of the learner
        self.partitions: list[dict[int, BufferedBatch]] = [{} for _ in range(partitions)]
        self.version = version
        self.in_flight: set[int] = set()
        self.error: BaseException | None = None
        self.closed = False
        self.cond = threading.Condition()

    def wait_for_version(self, version: int) -> float | None:
        """Block until the synced version is at least ``version``; the seconds waited, None once closed."""
        start = time.perf_counter()
        with self.cond:
            self.cond.wait_for(lambda: self.closed or self.version >= version)
            return None if self.closed else time.perf_counter() - start

    def start(self, step: int) -> None:
        with self.cond:
            self.in_flight.add(step)

    def put(self, batch: BufferedBatch) -> None:
        with self.cond:
            self.partitions[partition_of(batch.step, len(self.partitions))][batch.step] = batch
            self.in_flight.discard(batch.step)
            self.cond.notify_all()

    def held(self) -> list[int]:
        """Finished batches per partition, now."""
        with self.cond:
            return [len(p) for p in self.partitions]

    def take(self, step: int) -> tuple[BufferedBatch, float, float]:
        """Step ``step``'s batch (from its partition), the buffer's utilisation when asked
        (finished batches over the :attr:`slots`, at most 1) and the seconds the learner waited."""
        start = time.perf_counter()
        partition = self.partitions[partition_of(step, len(self.partitions))]
        with self.cond:
            utilisation = min(sum(len(p) for p in self.partitions), self.slots) / self.slots
            self.cond.wait_for(lambda: self.error is not None or step in partition)
            if self.error is not None:
                raise RuntimeError(f"the rollout producer failed while generating ahead: {self.error}") from self.error
            return partition.pop(step), utilisation, time.perf_counter() - start

    def publish_version(self, version: int) -> None:
        with self.cond:
            self.version = version
            self.cond.notify_all()

    def pending_steps(self) -> list[int]:
        """Steps generated or being generated and not yet trained (a resume regenerates them)."""
        with self.cond:
            return sorted(self.in_flight | {step for p in self.partitions for step in p})

    def fail(self, error: BaseException) -> None:
        with self.cond:
            self.error = error
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


def staleness_metrics(versions: list[int | None], trained_at: int, max_staleness: int) -> dict[str, float]:
    """Per-sample staleness (versions between the sampler's weights and the learner's): its mean,
    max and a count per value 0 … k (``async/staleness/<v>``, the histogram). A sample beyond k or
    with no version is refused: training on it would silently break the bound."""
    if any(v is None for v in versions):
        raise RuntimeError("asynchronous training got samples without a policy version (Completion.policy_version)")
    staleness = [trained_at - v for v in versions]
    if staleness and (max(staleness) > max_staleness or min(staleness) < 0):
        raise RuntimeError(
            f"samples {min(staleness)}..{max(staleness)} policy versions old reached the learner; "
            f"rollout.max_staleness is {max_staleness}"
        )
    counts = Counter(staleness)
    out = {f"async/staleness/{value}": float(counts.get(value, 0)) for value in range(max_staleness + 1)}
    out["async/staleness_mean"] = sum(staleness) / max(len(staleness), 1)
    out["async/staleness_max"] = float(max(staleness, default=0))
    return out


class AsyncTrainingLoop(TrainingLoop):
    """:class:`TrainingLoop` whose batches come from a producer thread running up to
    ``max_staleness`` steps ahead (see the module's docstring)."""

    def __init__(self, *, max_staleness: int, **loop_args: Any):
        super().__init__(**loop_args)
        self.max_staleness = max_staleness
        engine = self.collector.engine
        # The arm wraps the engine before its hooks are built (so periodic evaluation takes the lock too).
        self.engine = engine if isinstance(engine, VersionedEngine) else VersionedEngine(engine)
        self.engine.split(max_staleness)
        self.collector.engine = self.engine
        self.buffer: RolloutBuffer | None = None
        self._first_step = self.step_index + 1
        self._timer = PhaseTimer()

    def run(self) -> list[dict[str, float]]:
        for engine in (self.engine, *self.engine.partitions):  # the learner's weights (built or restored)
            engine.version = self.step_index
        partitions = len(self.engine.partitions)
        self.buffer = RolloutBuffer(self.max_staleness, version=self.step_index, partitions=partitions)
        draws = OrderedDraws(self.sampler, self.step_index + 1, one_draw_per_step=not self.collector.settings.dynamic_sampling)
        rewards = LockedRewards(self.collector.rewards)
        producers = [
            threading.Thread(
                target=self.produce,
                args=(self.buffer, draws, k, self.partition_collector(k, draws, rewards)),
                name=f"polyrl-rollout-{self.arm}-{k}",
                daemon=True,
            )
            for k in range(partitions)
        ]
        for producer in producers:
            producer.start()
        try:
            self.start_hooks()
            self._first_step = self.step_index + 1
            while self.step_index < self.steps:
                self.step()
        finally:
            self.buffer.close()
            draws.close()
            for producer in producers:
                producer.join()
        return self.history

    def partition_collector(self, partition: int, draws: OrderedDraws, rewards: LockedRewards) -> RolloutCollector:
        """The arm's collector on one partition's workers, drawing its prompts in step order (with
        ``env:``, playing the arm's episodes there: each turn one call on the partition's engine)."""
        return RolloutCollector(
            self.engine.partitions[partition], rewards, draws.draw, self.collector.settings, episodes=self.collector.episodes,
            teacher=self.collector.teacher,  # distill: the rows are scored where they are collected
        )  # fmt: skip

    def produce(self, buffer: RolloutBuffer, draws: OrderedDraws, partition: int, collector: RolloutCollector) -> None:
        """Collect this partition's steps among ``step_index + 1 … steps`` in order, each once the
        engine is recent enough and the step before it has drawn its prompts."""
        engine = self.engine.partitions[partition]
        try:
            for step in range(self.step_index + 1, self.steps + 1):
                if partition_of(step, len(buffer.partitions)) != partition:
                    continue
                waited = buffer.wait_for_version(step - 1 - self.max_staleness)
                if waited is None:
                    return
                buffer.start(step)
                locked_before = engine.lock_wait_s
                before = draws.begin(step)
                collected = collector.collect(step)
                buffer.put(
                    BufferedBatch(
                        step, collected, before, draws.end(step), waited + engine.lock_wait_s - locked_before, partition
                    )
                )
        except DrawsClosed:
            return
        except BaseException as error:  # noqa: BLE001 - handed to the learner, which raises it
            buffer.fail(error)
            draws.close()  # the other producers stop waiting for a turn this one will never pass

    def step(self) -> dict[str, float]:
        step, timer = self.step_index + 1, PhaseTimer()
        self._timer = timer
        batch, utilisation, waited = self.buffer.take(step)
        timer.seconds["wait_for_data"] += waited
        collected = batch.collected
        extra = staleness_metrics([c.policy_version for c in collected.rollout.completions], self.step_index, self.max_staleness)
        # perf/wait_for_data_s (the learner's wait for this batch) and perf/wait_for_engine_s (its
        # sync's wait for a generation in progress) come with the phase timer's metrics.
        extra.update(
            {
                "perf/engine_wait_s": batch.engine_wait_s,
                # Generation and scoring overlapped the learner: their times are reported, not part of perf/step_s.
                "perf/overlapped_generate_s": collected.seconds.get("generate", 0.0),
                "perf/overlapped_score_s": collected.seconds.get("score", 0.0),
            }
        )
        if step != self._first_step:  # the loop's first batch is always awaited: it says nothing of the balance
            extra["async/buffer_utilisation"] = utilisation
        if len(self.buffer.partitions) > 1:  # which partition collected it, and what each one held after the draw
            extra["async/partition"] = float(batch.partition)
            extra.update({f"async/partition_{k}/batches": float(n) for k, n in enumerate(self.buffer.held())})
        # What a checkpoint of this step records: the sampler after this batch (the producer has
        # drawn further) and the steps in flight, which a resume regenerates.
        self.checkpointer.note(sampler=batch.sampler_after, async_in_flight=[s for s in self.buffer.pending_steps() if s > step])
        return self.train_on(step, collected, timer, batch.sampler_before, extra)

    def learner_update(self, batch: Any) -> dict[str, float]:
        # This loop numbers versions by completed steps (the module's docstring): the learner's
        # weights are version step_index, whatever updates the steps before made.
        return self.learner.update(batch, self.step_index, weight_version=self.step_index)

    def sync(self) -> None:
        """The new weights and their version (this step's) to the engine, under its lock; the
        producer may then start the next step while this one's hooks run."""
        with self.engine.syncing(self.step_index + 1) as waited:
            sync_policy(self.collector, self.learner, self.engine_dtype, adapter=self.adapter_sync)
        self.buffer.publish_version(self.step_index + 1)
        # The wait for a generation in progress (one engine: weights cannot change mid-generation)
        # is its own phase, so perf/sync_s and the communication share are the transfer alone.
        self._timer.seconds["sync"] -= waited
        self._timer.seconds["wait_for_engine"] += waited

    def train_on(
        self,
        step: int,
        collected: Collected,
        timer: PhaseTimer,
        step_start_sampler: dict[str, Any],
        extra_metrics: dict[str, float] | None = None,
    ) -> dict[str, float]:
        metrics = super().train_on(step, collected, timer, step_start_sampler, extra_metrics)
        # A step without an update (dynamic sampling kept nothing) made no sync: its version is the
        # previous weights as they are. Either way the producer may now run one step further.
        self.engine.advance(step)
        self.buffer.publish_version(step)
        return metrics
