"""The rollout buffer's partitions, one per rollout worker (``rollout.workers: N`` with
``rollout.max_staleness: k`` ≥ 1), polyrl's own layout: each worker collects whole
batches on its own, into its own partition, and the learner draws them in a fixed order.

- **Partitions**: at most k + 1 steps are ever collected at once (step t waits for policy
  version t − 1 − k, and the learner trains step s at version s − 1), so there are
  P = min(N, k + 1) partitions, each a contiguous group of workers (:func:`worker_groups`; one
  worker each when k + 1 ≥ N) that cuts each of its steps over its workers: every worker stays
  busy, and k = 0 is one partition of all workers, the synchronous pool.
- **Which partition collects which step**: step t goes to partition (t − 1) mod P
  (:func:`partition_of`), so the learner's draw order depends on nothing but the step, also
  after a resume. Each partition has its own producer thread, which collects its steps in order
  on its own workers (:class:`~polyrl.engines.worker_pool.WorkerEngine`), without waiting for
  another partition's slower worker.
- **Prompts in step order** (:class:`OrderedDraws`): the producers share the prompt sampler, and
  step t draws only after step t − 1 has drawn everything it will, so each step gets the prompts
  (and per-request seeds, hence the samples) it gets with one engine, and the sampler positions
  a checkpoint records are exact. Without dynamic sampling a step's one draw passes the turn at
  once; with it, the turn passes when the step is collected (its refills depend on its rewards),
  which serialises collection but keeps it exact.
- **Scoring** runs under one lock (:class:`LockedRewards`): reward modules are not required to
  be thread-safe.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from polyrl.engines.worker_pool import contiguous_slices

__all__ = ["LockedRewards", "OrderedDraws", "partition_of", "worker_groups"]


def worker_groups(workers: int, max_staleness: int) -> list[list[int]]:
    """The rollout workers of each buffer partition: min(N, k + 1) contiguous groups whose sizes
    differ by at most one."""
    return [list(range(start, stop)) for start, stop in contiguous_slices(workers, min(workers, max_staleness + 1))]


def partition_of(step: int, partitions: int) -> int:
    """The partition (rollout worker) that collects ``step`` (1-based): round robin."""
    return (step - 1) % partitions


class DrawsClosed(Exception):
    """The loop ended (or a producer failed) while a producer waited for its turn to draw."""


class OrderedDraws:
    """The prompt sampler shared by the partition producers: steps draw in step order.

    A producer calls :meth:`begin` (waits for its step's turn; the sampler's position before),
    runs the collector, whose prompt source is :meth:`draw`, then :meth:`end` (the position after
    the step's draws; passes the turn if the first draw did not already).
    """

    def __init__(self, sampler: Any, first_step: int, *, one_draw_per_step: bool):
        self.sampler = sampler
        self.next_step = first_step  # the step whose turn it is to draw
        self.one_draw_per_step = one_draw_per_step
        self.cond = threading.Condition()
        self.closed = False
        self._local = threading.local()  # the step this thread is collecting
        self._after: dict[int, dict[str, Any]] = {}

    def begin(self, step: int) -> dict[str, Any]:
        with self.cond:
            self.cond.wait_for(lambda: self.closed or self.next_step == step)
            if self.closed:
                raise DrawsClosed(step)
            self._local.step = step
            return self.sampler.state_dict()

    def draw(self, count: int) -> list[Any]:
        step = self._local.step
        with self.cond:
            if self.next_step != step:
                raise RuntimeError(f"step {step} draws prompts after its turn passed (dynamic sampling with one_draw_per_step)")
            batch = self.sampler.next_batch(count, step=step)  # a data mixture's weights may follow the step
            if self.one_draw_per_step:
                self._pass(step)
            return batch

    def end(self, step: int) -> dict[str, Any]:
        with self.cond:
            if self.next_step == step:
                self._pass(step)
            return self._after.pop(step)

    def _pass(self, step: int) -> None:
        self._after[step] = self.sampler.state_dict()
        self.next_step = step + 1
        self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class LockedRewards:
    """A reward object whose :meth:`score` runs one call at a time; the rest passes through."""

    def __init__(self, rewards: Any, lock: threading.Lock | None = None):
        self.rewards = rewards
        self.lock = lock or threading.Lock()

    def score(self, batch: Any) -> Any:
        with self.lock:
            return self.rewards.score(batch)

    def close(self) -> None:
        """The arm's collector closes the reward modules."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return getattr(self.rewards, name)
