"""Evaluation inside training: every ``eval.every`` steps the training loop calls the evaluator.

``make_periodic_evaluator(config)`` loads ``config.eval.suite`` (capped at ``config.eval.limit``
prompts per dataset) and sets up its metric modules once, when the arm starts, so a bad suite
fails before any training step. The returned callable runs the suite on the training run's own
rollout engine (already synced to the current weights) and returns a :class:`PeriodicResult`:
the suite's metrics, which training logs as ``eval/<metric>``, its per-sample rows, and the
per-example outcomes as artifacts (``eval_examples/<suite>/step_<n>.jsonl``,
:mod:`polyrl.evals.example_outcomes`), which the training loop logs beside them.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

import torch

from polyrl.data.chat import ChatFormat
from polyrl.data.splits import overlap_warning
from polyrl.evals.example_outcomes import PERIODIC_SAMPLES_FILE, example_files
from polyrl.evals.harness import EvalResult, SuiteRunner
from polyrl.evals.suite import EvalError
from polyrl.runtime.devices import device_count


@dataclass
class PeriodicResult:
    metrics: dict[str, float]
    rows: list[dict[str, Any]] = field(default_factory=list)
    result: EvalResult | None = None  # the suite's full result (datasets, per-dataset counts)
    # Artifact file -> text, logged to the training run as they are: the per-example outcomes.
    artifacts: dict[str, str] = field(default_factory=dict)


class PeriodicEvaluator:
    def __init__(self, runner: SuiteRunner, *, arm: str | None = None, seed: int | None = None):
        """``arm``, ``seed``: written into each per-example row (the run's tags say them too)."""
        self.runner, self.arm, self.seed = runner, arm, seed

    def overlap_warnings(self, training_samples: list[Any]) -> list[str]:
        """One warning per eval dataset some of whose rows are training rows (same prompt text
        and image pixels), with how many: its scores then partly measure memorisation."""
        found = (overlap_warning(data.spec.label, data.samples, training_samples) for data in self.runner.datasets)
        return [warning for warning in found if warning]

    def __call__(self, engine: Any, step: int) -> PeriodicResult:
        # The HF engine seeds torch's global generator for each generate call; forking keeps
        # an eval from moving the training run's random stream (resume equals uninterrupted).
        devices = list(range(device_count()))
        with torch.random.fork_rng(devices=devices):
            result = self.runner.run(engine)
        # NaN (e.g. accuracy with no gold answers) is logged as NaN, so the curve shows the
        # metric was computed and undefined rather than silently missing; non-numbers are dropped.
        metrics = {
            key: value for key, value in result.metrics.items() if isinstance(value, numbers.Real) and not isinstance(value, bool)
        }
        samples_file = PERIODIC_SAMPLES_FILE.format(step=step)
        artifacts = example_files(result, arm=self.arm, seed=self.seed, step=step, samples_file=samples_file)
        return PeriodicResult(metrics, list(result.rows or []), result, artifacts)


def make_periodic_evaluator(config: Any, *, arm: str | None = None) -> PeriodicEvaluator:
    """The evaluator of an :class:`~polyrl.config.schema.ExperimentConfig` (``config.eval``);
    ``arm`` names the arm in its per-example rows (the seed is ``config.seed``)."""
    suite = getattr(config.eval, "suite", None)
    if not suite:
        raise EvalError("eval.suite: periodic evaluation needs a suite name or path")
    data = config.data  # datasets that set no chat settings are formatted as the run's training prompts
    chat = ChatFormat(data.chat_template, data.system_prompt, data.messages_field)
    runner = SuiteRunner(suite, limit=config.eval.limit, chat=chat)
    if getattr(config, "env", None) is not None:
        # Episodes: the suite's prompts played with the run's environment (polyrl/evals/episodes.py).
        from polyrl.evals.episodes import EpisodeSuiteRunner
        from polyrl.trainer.build_rollout import build_episodes

        episodes = EpisodeSuiteRunner(runner, lambda tokenizer: build_episodes(config, tokenizer))
        return PeriodicEvaluator(episodes, arm=arm, seed=config.seed)
    return PeriodicEvaluator(runner, arm=arm, seed=config.seed)
