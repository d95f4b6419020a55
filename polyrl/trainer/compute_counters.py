"""Cumulative compute per run, logged every step, so arms that do different work per step can be
compared at equal compute rather than at equal steps.

Each step adds to four counters, logged as metrics at that step:

- ``compute/generated_tokens``: every completion token the engine sampled for training (all
  dynamic-sampling rounds included: ``rollout/samples`` × ``rollout/response_length/mean``);
  ReMax's greedy baseline sample and periodic evaluation are not counted;
- ``compute/learner_tokens``: prompt and completion tokens of the rows the learner trained on,
  once per pass over the batch (``train.updates_per_batch``);
- ``compute/learner_flops``: ``6 · N · learner_tokens`` for the trained passes, N the policy's
  parameter count (the forward-and-backward estimate of Kaplan et al., "Scaling Laws for Neural
  Language Models", arXiv 2001.08361, §2.1); forward passes without gradient (old log-probs, the
  reference, the critic) are not counted, and with LoRA or frozen parts the backward costs less
  than the 4N of a full one, so the figure compares recipes of one model set-up, not set-ups;
- ``compute/seconds``: the training steps' wall time (``perf/step_s`` summed; evaluation and
  start-up are outside the steps).

The counters live in every checkpoint, so a resumed run continues them rather than restarting
at zero. ``polyrl compare --axis tokens|flops|seconds`` reads them; MLflow's chart view can
use any of them as the x-axis of a line chart.
"""

from __future__ import annotations

from typing import Any

from polyrl.trainer.hooks import Checkpointer, Hook, StepReport

__all__ = ["COUNTERS", "ComputeCounters"]

COUNTERS = ("generated_tokens", "learner_tokens", "learner_flops", "seconds")


class ComputeCounters(Hook):
    def __init__(
        self, *, parameters: int, passes_per_batch: int, checkpointer: Checkpointer | None, start: dict[str, Any] | None = None
    ):
        self.parameters, self.passes = int(parameters), int(passes_per_batch)
        self.checkpointer = checkpointer
        self.totals = {name: float((start or {}).get(name, 0.0)) for name in COUNTERS}

    def publish(self, report: StepReport) -> None:
        metrics = report.metrics
        samples = metrics.get("rollout/samples", 0.0)
        generated = samples * metrics.get("rollout/response_length/mean", 0.0) if samples else 0.0
        learner_tokens = metrics.get("train/tokens", 0.0) * self.passes
        self.totals["generated_tokens"] += generated
        self.totals["learner_tokens"] += learner_tokens
        self.totals["learner_flops"] += 6.0 * self.parameters * learner_tokens
        self.totals["seconds"] += metrics.get("perf/step_s", 0.0)
        metrics.update({f"compute/{name}": value for name, value in self.totals.items()})
        if self.checkpointer is not None:
            self.checkpointer.note(compute=dict(self.totals))

    def state_dict(self) -> dict[str, float]:
        return dict(self.totals)
