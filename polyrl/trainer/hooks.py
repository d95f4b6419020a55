"""Hooks the training loop calls after each step: health, sample tables, periodic evaluation,
metric logging, checkpointing and user callbacks.

Each hook gets a :class:`StepReport` (plain data: the step, its metrics, the rollout's sample
rows) and whatever it needs in its constructor (the tracker, the evaluator and the engine as
:mod:`polyrl.trainer.protocols` describes them); none reaches into the loop. ``observe`` runs
inside the step's "log" phase and may add metrics; ``publish`` runs once the metrics are final
(timings included), in list order: log, then checkpoint, then callbacks (a kill in between
then repeats the step on resume, and the logger skips what it already has, instead of losing it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from polyrl.core.types import PromptSample
from polyrl.monitoring.health import HealthMonitor
from polyrl.tracking.sample_html import has_images, samples_html
from polyrl.trainer.checkpoint import latest_checkpoint, load_checkpoint, prune_checkpoints, save_checkpoint
from polyrl.trainer.protocols import Engine, Evaluator, Tracker

__all__ = ["Callback", "Checkpointer", "HealthHook", "Hook", "MetricLogger", "PeriodicEvalHook", "SampleTableHook", "StepReport"]


@dataclass
class StepReport:
    step: int
    metrics: dict[str, float]  # observe hooks may add to it
    samples: list[dict[str, Any]] = field(default_factory=list)  # prompt, completion, reward, length, finish_reason
    # The PromptSample of each row of ``samples`` (its images and references) and each reward
    # module's score per row: the image sample table is drawn from them.
    prompts: list[PromptSample] = field(default_factory=list)
    reward_parts: dict[str, list[float | None]] = field(default_factory=dict)
    # Per row of ``samples``: the completion's token "ids" and per-token quantities by name, for the
    # rollout inspector (polyrl/tracking/inspector.py): "sampler_logprob" always; on the steps the
    # inspector asked for (InspectorHook.wants_learner_tokens) the learner's "learner_logprob",
    # "entropy", "advantage", "ratio", "clipped" (objectives with a clip) and "masked" (with a
    # rejecting rollout correction), None where a token has none (polyrl/learner/token_capture.py).
    tokens: list[dict[str, list[Any]]] = field(default_factory=list)
    # Per row of ``samples``: its prompt's group id (the G samples of one prompt share it; the replay store).
    group_ids: list[int] = field(default_factory=list)


class Hook:
    # What :meth:`start` measured (the periodic evaluation's step-0 scores), given to every hook's
    # :meth:`started`; empty for the others. An instance sets its own; this default is never mutated.
    start_metrics: Mapping[str, float] = MappingProxyType({})

    def start(self, step: int) -> None:
        """The loop starts after ``step`` completed steps (0: a fresh run)."""

    def started(self, step: int, metrics: dict[str, float]) -> None:
        """After every hook's :meth:`start`: what they measured there (the ``start_metrics`` of
        each, e.g. the step-0 evaluation), for hooks that follow a series from its start."""

    def observe(self, report: StepReport) -> None:
        """In the step's log phase; may add metrics."""

    def publish(self, report: StepReport) -> None:
        """After the metrics are final."""


def _replayed(logger: Tracker | None, step: int) -> bool:
    """A step the logger already has (recomputed after a resume): MLflow tables append, so
    tables and evaluations of it are not written again."""
    return logger is not None and step in logger.logged_steps()


class HealthHook(Hook):
    """The health checks after every step; ``notes`` (warnings found while setting up, e.g. eval
    rows that are training rows) are said when the loop starts."""

    def __init__(
        self,
        monitor: HealthMonitor,
        *,
        arm: str,
        printer: Callable[[str], None] = print,
        logger: Tracker | None = None,
        notes: list[str] | None = None,
    ):
        self.monitor, self.arm, self.printer, self.logger = monitor, arm, printer, logger
        self.notes = list(notes or []) + list(getattr(monitor, "notes", []))  # the monitor's own set-up warnings too

    def start(self, step: int) -> None:
        for note in self.notes:
            self.printer(f"[{self.arm}] warning: {note}")
            if self.logger is not None:
                self.logger.set_tags({f"health.{note.split(':', 1)[0]}": note.split(":", 1)[-1].strip()})

    def started(self, step: int, metrics: dict[str, float]) -> None:
        # The step-0 evaluation is the held-out series' first point (without it, a run evaluated
        # at steps 0 and N had one point and the held-out check could not fire).
        if metrics:
            self._say(step, self.monitor.check_held_out(step, dict(metrics)))

    def observe(self, report: StepReport) -> None:
        warnings = self.monitor.check(report.step, report.metrics)
        warnings += self.monitor.check_samples(report.step, report.samples, report.reward_parts, report.metrics)
        report.metrics["health/warnings"] = float(len(warnings))
        self._say(report.step, warnings)

    def publish(self, report: StepReport) -> None:
        # The training reward against the held-out score: the periodic evaluation adds the latter
        # after observe, so it is read here (before the metric logger, which comes later in the list).
        self._say(report.step, self.monitor.check_held_out(report.step, report.metrics))

    def _say(self, step: int, warnings: list[str]) -> None:
        for warning in warnings:
            self.printer(f"[{self.arm}] health warning at step {step}: {warning}")
        if self.logger is not None:
            for warning in warnings:
                self.logger.set_tags({f"health.{warning.split(':', 1)[0]}": f"step {step}: {warning.split(':', 1)[-1].strip()}"})


class SampleTableHook(Hook):
    """The first ``rows`` samples of every ``every``-th step (and step 1) as an MLflow table;
    when any of them has prompt images, also as ``samples/step_<n>.html`` with the images
    (:mod:`polyrl.tracking.sample_html`)."""

    def __init__(self, logger: Tracker, *, every: int, rows: int, answer_field: str = "answer"):
        self.logger, self.every, self.rows, self.answer_field = logger, every, rows, answer_field

    def observe(self, report: StepReport) -> None:
        step = report.step
        if _replayed(self.logger, step) or not (step % self.every == 0 or step == 1):
            return
        rows = [{"step": step, **sample} for sample in report.samples[: self.rows]]
        if not rows:
            return
        self.logger.log_table(rows, f"samples/step_{step:05d}.json")
        prompts = report.prompts[: len(rows)]
        images = [list(p.images) for p in prompts]
        episodes = any("episode" in row for row in rows)  # shown turn by turn in the page
        if len(prompts) == len(rows) and (has_images(images) or episodes):
            rich = [
                {
                    **row,
                    "references": list(p.references),
                    "answer": p.fields.get(self.answer_field),
                    **{f"reward/{label}": values[i] for label, values in report.reward_parts.items() if i < len(values)},
                }
                for i, (row, p) in enumerate(zip(rows, prompts))
            ]
            self.logger.log_text(samples_html(rich, images, title=f"samples at step {step}"), f"samples/step_{step:05d}.html")


class PeriodicEvalHook(Hook):
    """``evaluator(engine, step)`` every ``every`` steps and at the start of a fresh run (step 0,
    so every eval curve begins at the model the arm started from). The evaluator returns an
    object with ``metrics`` and ``rows`` (:class:`polyrl.evals.periodic.PeriodicResult`), and
    may give ``artifacts`` (file -> text: the per-example outcomes), logged as they are."""

    def __init__(self, evaluator: Evaluator, engine: Engine, *, every: int, logger: Tracker | None = None):
        self.evaluator, self.engine, self.every, self.logger = evaluator, engine, every, logger
        self.start_metrics: dict[str, float] = {}

    def start(self, step: int) -> None:
        if step != 0 or not self.every:
            return
        result = self.evaluator(self.engine, 0)
        self.start_metrics = {f"eval/{k}": v for k, v in result.metrics.items()}
        if self.logger is not None:
            self.logger.log_metrics(0, self.start_metrics)
            _log_evaluation(self.logger, 0, result)

    def observe(self, report: StepReport) -> None:
        step = report.step
        if not self.every or step % self.every or _replayed(self.logger, step):
            return
        result = self.evaluator(self.engine, step)
        report.metrics.update({f"eval/{k}": v for k, v in result.metrics.items()})
        if self.logger is not None:
            _log_evaluation(self.logger, step, result)


def _log_evaluation(logger: Tracker, step: int, result: Any) -> None:
    """An evaluation's artifacts (the per-example outcomes) and sample table (with images, a page too)."""
    for artifact_file, text in getattr(result, "artifacts", {}).items():  # a plain EvalOutcome has none
        logger.log_text(text, artifact_file)
    if result.rows:
        rows = [{"step": step, **row} for row in result.rows]
        logger.log_table(rows, f"eval_samples/step_{step:05d}.json")
        # The suite's full result, where the evaluator gives one (PeriodicResult.result), has the rows' images.
        images = getattr(getattr(result, "result", None), "row_images", None) or []
        if len(images) == len(rows) and has_images(images):
            logger.log_text(
                samples_html(rows, images, title=f"eval samples at step {step}"), f"eval_samples/step_{step:05d}.html"
            )


class MetricLogger(Hook):
    def __init__(self, logger: Tracker):
        self.logger = logger

    def publish(self, report: StepReport) -> None:
        self.logger.log_step(report.step, report.metrics)


class Callback(Hook):
    """``fn(step, metrics)`` after each step (a progress bar, a stop request)."""

    def __init__(self, fn: Callable[[int, dict[str, float]], None]):
        self.fn = fn

    def publish(self, report: StepReport) -> None:
        self.fn(report.step, report.metrics)


class Checkpointer(Hook):
    """Saves every ``every`` steps and after ``last_step``; keeps the newest ``keep``.

    ``models`` and ``optimizers`` are saved by name; ``state()`` gives the JSON bookkeeping of
    the roles (sampler position, health, optimizer steps), ``extra`` what the caller wants in
    every checkpoint (e.g. MLflow run ids, the config).
    """

    def __init__(self, arm_dir: str | Path, *, every: int, keep: int, last_step: int, models: dict[str, Any],
                 optimizers: dict[str, Any], state: Callable[[], dict[str, Any]], extra: dict[str, Any] | None = None,
                 logger: Tracker | None = None):  # fmt: skip
        self.arm_dir = Path(arm_dir)
        self.every, self.keep, self.last_step = every, keep, last_step
        self.models, self.optimizers, self.state, self.extra, self.logger = models, optimizers, state, dict(extra or {}), logger

    def publish(self, report: StepReport) -> None:
        if report.step % self.every == 0 or report.step == self.last_step:
            self.save(report.step)

    def note(self, **state: Any) -> None:
        """Bookkeeping for every later save, over ``state()``'s (the asynchronous loop's consumed
        sampler position, which the sampler itself has run past)."""
        self.extra.update(state)

    def save(self, step: int, extra: dict[str, Any] | None = None) -> Path:
        path = save_checkpoint(
            self.arm_dir / f"step_{step:06d}",
            step=step,
            models=self.models,
            optimizers=self.optimizers,
            state={**self.state(), **self.extra, **(extra or {})},
        )
        prune_checkpoints(self.arm_dir, self.keep)
        if self.logger is not None:
            self.logger.set_tags({"polyrl.latest_checkpoint": str(path.resolve()), "polyrl.latest_checkpoint_step": step})
        return path

    def restore_latest(self) -> dict[str, Any] | None:
        """Load the latest checkpoint into the models and optimizers; its bookkeeping, or None."""
        checkpoint = latest_checkpoint(self.arm_dir)
        if checkpoint is None:
            return None
        return load_checkpoint(checkpoint, models=self.models, optimizers=self.optimizers)
