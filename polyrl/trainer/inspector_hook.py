"""The hook that writes the rollout inspector page (:mod:`polyrl.tracking.inspector`) for the
steps that get a sample table: to MLflow as ``inspector/step_<n>.html`` and beside the arm's
checkpoints as ``<checkpoint.dir>/<name>/<arm>/inspector/step_<n>.html``. It shows every sample
of the step (not only the table's first rows), so its mean reward is the step's reward/mean.

On those steps it asks the loop for the learner's per-token values too (:meth:`wants_learner_tokens`;
polyrl/learner/token_capture.py): the learner's log-prob, entropy, advantage, ratio, clip
and rollout-correction masks join the sampler's log-prob as shading choices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polyrl.tracking.inspector import inspector_html, inspector_rows
from polyrl.tracking.replay_store import ReplayStore, step_record
from polyrl.trainer.hooks import Hook, StepReport, _replayed
from polyrl.trainer.protocols import Tracker


class InspectorHook(Hook):
    def __init__(
        self,
        logger: Tracker | None,
        *,
        every: int,
        tokenizer: Any = None,
        local_dir: str | Path | None = None,
        judge_rule_pairs: dict[str, str] | None = None,
    ):
        self.logger, self.every, self.tokenizer = logger, every, tokenizer
        self.local_dir = None if local_dir is None else Path(local_dir)
        self.judge_rule_pairs = dict(judge_rule_pairs or {})

    def _writes(self, step: int) -> bool:
        return not _replayed(self.logger, step) and (step % self.every == 0 or step == 1)

    def wants_learner_tokens(self, step: int) -> bool:
        """Whether step ``step`` gets a page (the loop asks before the update; the other steps capture nothing)."""
        return self._writes(step)

    def observe(self, report: StepReport) -> None:
        step = report.step
        if not self._writes(step) or not report.samples:
            return
        tokens = values = None
        if self.tokenizer is not None and len(report.tokens) == len(report.samples):
            tokens = [[self.tokenizer.decode([i]) for i in t["ids"]] for t in report.tokens]
            # A quantity with another length than the ids (an episode's observation tokens carry no
            # sampler log-prob) would shade the wrong tokens: left out of that row. The learner's
            # quantities have one value per id, None on observation tokens (left unshaded).
            values = [{k: v for k, v in t.items() if k != "ids" and len(v) == len(t["ids"])} for t in report.tokens]
        rows = inspector_rows(report.samples, tokens=tokens, token_values=values, parts=report.reward_parts)
        prompts = list(dict.fromkeys(str(s.get("prompt", "")) for s in report.samples))
        page = inspector_html(
            rows, title=f"rollout inspector: step {step}", prompts=prompts, judge_rule_pairs=self.judge_rule_pairs
        )
        name = f"step_{step:05d}.html"
        if self.logger is not None:
            self.logger.log_text(page, f"inspector/{name}")
        if self.local_dir is not None:
            self.local_dir.mkdir(parents=True, exist_ok=True)
            (self.local_dir / name).write_text(page)


class ReplayStoreHook(Hook):
    """Every step's groups into the arm's reward-replay store (:mod:`polyrl.tracking.replay_store`,
    ``tracking.replay_store``): prompts, completions (text and token ids) and every reward's raw
    score, for ``polyrl replay`` (polyrl/analysis/replay.py). ``header``: the run's id and resolved
    config, written once at the start (a resumed run of the same id appends to its file)."""

    def __init__(self, path: str | Path, header: dict[str, Any]):
        self.store, self.header = ReplayStore(path), header

    def start(self, step: int) -> None:
        self.store.start(self.header)

    def observe(self, report: StepReport) -> None:
        if not report.samples:  # dynamic sampling found no informative group: nothing was trained
            return
        self.store.append(
            step_record(
                report.step,
                samples=report.samples,
                prompts=report.prompts,
                reward_parts=report.reward_parts,
                tokens=report.tokens,
                group_ids=report.group_ids,
            )
        )
