"""Asynchronous, off-policy training (``rollout.max_staleness: k`` ≥ 1): a producer thread
generates and scores the batches of steps s+1 … s+k while the learner updates on step s.

- Versions: the policy version is the number of completed training steps; the engine's weights
  carry the version of their last sync (:class:`VersionedEngine`), and every sample is stamped
  with the version that sampled it (``Completion.policy_version``).
- Staleness bound, by throttling: the producer starts step t only once the engine holds version
  ≥ t − 1 − k, and step t trains at version t − 1, so no sample is more than k versions old and
  none is ever dropped. The learner checks the bound on every batch and refuses a violation.
- One engine lock: generation (the producer's, and periodic evaluation's) and weight syncs (the
  learner's, between updates) never interleave on the in-process engine.
- The buffer holds finished batches per rollout worker (one partition per engine; one engine
  here, so one partition).
- The ratio's π_old is the behaviour policy: the pipeline reads the sampler's log-probs
  (:func:`polyrl.roles.pipeline.behaviour_logprobs`), so clipping and BAPO's bounds see the real
  staleness; with truncated importance sampling the TIS weight carries it instead (decoupled PPO).
- Resume: a checkpoint records the sampler position after the last *consumed* batch (the
  producer has drawn further) and the steps that were in flight; a resume regenerates those, so
  no prompt is lost or repeated.

With k = 0 the producer waits for each sync before generating, which is the synchronous loop
step for step (``test_async_loop`` checks bit-equal parameters); the arm runs the plain
:class:`~polyrl.roles.loop.TrainingLoop` for k = 0 all the same. Runs with k ≥ 1 are not
bit-reproducible: which version sampled a batch depends on timing (the versions are logged).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

from polyrl.roles.loop import PhaseTimer, TrainingLoop, sync_policy

__all__ = ["AsyncTrainingLoop", "BufferedBatch", "RolloutBuffer", "VersionedEngine", "staleness_metrics"]


class VersionedEngine:
    """A rollout engine behind one lock, with the policy version of its weights; each generated
    completion is stamped with it. Other attributes pass through to the engine."""

    def __init__(self, engine: Any, version: int = 0):
        self.engine = engine
        self.version = version
        self.lock = threading.Lock()
        self.lock_wait_s = 0.0  # time generate calls waited for a sync (or an evaluation) to finish

    def generate(self, prompts: Any, settings: Any) -> Any:
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
        with self.lock:
            yield time.perf_counter() - asked
            self.version = version

    def advance(self, version: int) -> None:
        """A step that made no update: the weights are those of ``version`` as they are."""
        with self.lock:
            self.version = max(self.version, version)

    def close(self) -> None:
        self.engine.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


@dataclass
class BufferedBatch:
    step: int
    collected: Any  # polyrl.roles.collector.Collected
    sampler_before: dict[str, Any]  # the prompt sampler's position before this step's draws
    sampler_after: dict[str, Any]  # ... and after them: what a checkpoint of this step records
    engine_wait_s: float  # the producer's wait for newer weights (throttle and engine lock)


class RolloutBuffer:
    """Finished batches by step, one partition per rollout worker, and the newest synced policy
    version the producer throttles on; a producer error reaches the learner's next :meth:`take`."""

    def __init__(self, max_staleness: int, version: int, workers: int = 1):
        self.slots = max(max_staleness, 1)  # the k batches generation may run ahead of the learner
        self.partitions: list[dict[int, BufferedBatch]] = [{} for _ in range(workers)]
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

    def put(self, batch: BufferedBatch, worker: int = 0) -> None:
        with self.cond:
            self.partitions[worker][batch.step] = batch
            self.in_flight.discard(batch.step)
            self.cond.notify_all()

    def take(self, step: int, worker: int = 0) -> tuple[BufferedBatch, float, float]:
        """Step ``step``'s batch, the buffer's utilisation when asked (finished batches over the
        :attr:`slots`, at most 1) and the seconds the learner waited for it."""
        start = time.perf_counter()
        with self.cond:
            utilisation = min(sum(len(p) for p in self.partitions), self.slots) / self.slots
            self.cond.wait_for(lambda: self.error is not None or step in self.partitions[worker])
            if self.error is not None:
                raise RuntimeError(f"the rollout producer failed while generating ahead: {self.error}") from self.error
            return self.partitions[worker].pop(step), utilisation, time.perf_counter() - start

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
        raise RuntimeError(f"samples {min(staleness)}..{max(staleness)} policy versions old reached the learner; "
                           f"rollout.max_staleness is {max_staleness}")
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
        self.collector.engine = self.engine
        self.buffer: RolloutBuffer | None = None
        self._first_step = self.step_index + 1
        self._timer = PhaseTimer()

    def run(self) -> list[dict[str, float]]:
        self.engine.version = self.step_index  # the engine holds the learner's weights (built or restored)
        self.buffer = RolloutBuffer(self.max_staleness, version=self.step_index)
        producer = threading.Thread(target=self.produce, args=(self.buffer,), name=f"polyrl-rollout-{self.arm}", daemon=True)
        producer.start()
        try:
            for hook in self.hooks:
                hook.start(self.step_index)
            self._first_step = self.step_index + 1
            while self.step_index < self.steps:
                self.step()
        finally:
            self.buffer.close()
            producer.join()
        return self.history

    def produce(self, buffer: RolloutBuffer) -> None:
        """Collect steps ``step_index + 1 … steps`` in order, each once the engine is recent enough."""
        try:
            for step in range(self.step_index + 1, self.steps + 1):
                waited = buffer.wait_for_version(step - 1 - self.max_staleness)
                if waited is None:
                    return
                buffer.start(step)
                locked_before = self.engine.lock_wait_s
                before = self.sampler.state_dict()
                collected = self.collector.collect(step)
                buffer.put(BufferedBatch(step, collected, before, self.sampler.state_dict(),
                                         waited + self.engine.lock_wait_s - locked_before))
        except BaseException as error:  # noqa: BLE001 - handed to the learner, which raises it
            buffer.fail(error)

    def step(self) -> dict[str, float]:
        step, timer = self.step_index + 1, PhaseTimer()
        self._timer = timer
        batch, utilisation, waited = self.buffer.take(step)
        timer.seconds["wait_for_data"] += waited
        collected = batch.collected
        extra = staleness_metrics([c.policy_version for c in collected.rollout.completions], self.step_index, self.max_staleness)
        # perf/wait_for_data_s (the learner's wait for this batch) and perf/wait_for_engine_s (its
        # sync's wait for a generation in progress) come with the phase timer's metrics.
        extra.update({"perf/engine_wait_s": batch.engine_wait_s,
                      # Generation and scoring overlapped the learner: their times are reported, not part of perf/step_s.
                      "perf/overlapped_generate_s": collected.seconds.get("generate", 0.0),
                      "perf/overlapped_score_s": collected.seconds.get("score", 0.0)})
        if step != self._first_step:  # the loop's first batch is always awaited: it says nothing of the balance
            extra["async/buffer_utilisation"] = utilisation
        # What a checkpoint of this step records: the sampler after this batch (the producer has
        # drawn further) and the steps in flight, which a resume regenerates.
        self.checkpointer.note(sampler=batch.sampler_after, async_in_flight=[s for s in self.buffer.pending_steps() if s > step])
        return self.train_on(step, collected, timer, batch.sampler_before, extra)

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

    def train_on(self, step: int, collected: Any, timer: PhaseTimer, step_start_sampler: dict[str, Any],
                 extra_metrics: dict[str, float] | None = None) -> dict[str, float]:
        metrics = super().train_on(step, collected, timer, step_start_sampler, extra_metrics)
        # A step without an update (dynamic sampling kept nothing) made no sync: its version is the
        # previous weights as they are. Either way the producer may now run one step further.
        self.engine.advance(step)
        self.buffer.publish_version(step)
        return metrics
