"""The policy learner: optimizer and LR schedule, the mini/micro-batch loop with its normaliser,
gradient clipping, the non-finite guard, the objective's ``prepare`` hook and mixed precision.

In: a :class:`~polyrl.rollout.batches.LearnerBatch` (plain data); out: a dict of metrics. Master
weights and optimizer state are fp32 whatever the compute dtype (:mod:`polyrl.runtime.precision`);
dropout is off in every pass; an optimizer step whose loss or gradient norm is NaN/inf is
skipped, and too many in a row raise :class:`~polyrl.monitoring.health.NonFiniteStop`. A stop in the
middle of an update skips the update's remaining optimizer steps (as verl skips a non-finite
step) and says how many of its steps were applied (``applied_steps``): with none, the learner is
as it was after the previous step; with some, the step counts as done with the rest skipped.
Either way the loop's checkpoint is of a whole step, never of part of one, and nothing is copied.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch
from torch import Tensor

from polyrl.algos.aggregation import loss_normalizer_count
from polyrl.algos.entropy_control import EntropyController
from polyrl.algos.metric_parts import MetricAccumulator
from polyrl.algos.rollout_correction import mismatch_from_sums, mismatch_sums
from polyrl.learner.lr_schedule import apply_optimizer_settings, lr_factor
from polyrl.learner.micro_batch_loss import PolicyLoss
from polyrl.learner.nonfinite import NONFINITE_REASONS, NonFiniteGuard, NonFiniteStop, guarded_step
from polyrl.learner.token_capture import TokenCapture
from polyrl.modeling.lora import write_adapter
from polyrl.modeling.microbatches import length_sorted_micro_batches, token_budget_micro_batches, trim_padding
from polyrl.modeling.shared_prompts import attention_cost_ratio, completion_widths, row_prompts, shared_prompt_micro_batches
from polyrl.rollout.batches import LearnerBatch
from polyrl.runtime.data_parallel import LocalGroup
from polyrl.runtime.gradient_buffers import AutogradGradients, GradientBuffers, update_gradients
from polyrl.runtime.precision import autocast

__all__ = ["LearnerSettings", "PolicyLearner", "rows_to_diagnose"]


@dataclass(frozen=True)
class LearnerSettings:
    aggregation: str
    objective_params: dict[str, Any] = field(default_factory=dict)
    learning_rate: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    total_steps: int = 1  # training steps; the schedule runs over their optimizer steps
    updates_per_batch: int = 1
    mini_batches: int = 1
    micro_batch_size: int = 16
    micro_batch_tokens: int | None = None  # with it, micro-batches are cut by computed positions, at most micro_batch_size rows
    share_prompts: bool = (
        False  # a prompt's completions packed into one row with it, where that pays (polyrl.modeling.shared_prompts)
    )
    padding_free: bool = False  # a micro-batch's rows end to end in one forward, no padding columns (polyrl.modeling.packing)
    max_grad_norm: float = 1.0
    max_consecutive_nonfinite: int = 3
    temperature: float = 1.0
    max_tokens: int = 64  # the longest response (seq_sum_constant_norm's normaliser)
    kl_coef: float = 0.0  # in the loss; 0 when the KL is folded into the rewards
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    entropy_control: Any = None  # AdaptiveEntropySettings: entropy_coef adapted toward a target after each step
    high_entropy_top_ratio: float | None = None  # only this share of tokens, by entropy, keeps its gradient
    seed: int = 0
    compute_dtype: torch.dtype = torch.float32


class PolicyLearner(PolicyLoss):
    """Updates ``policy`` (fp32, dropout off) with ``objective`` (an :class:`ObjectiveSpec`);
    ``critic`` (optional) gets each applied policy step and keeps its own cadence."""

    def __init__(
        self,
        policy: torch.nn.Module,
        objective: Any,
        settings: LearnerSettings,
        critic: Any | None = None,
        lora: Any | None = None,
        group: Any | None = None,
    ):
        # ``group`` (polyrl.runtime.data_parallel): this rank's place among data-parallel learner
        # ranks (train.learner_workers); by default one process, whose collectives do nothing.
        self.group = group if group is not None else LocalGroup()
        # ``lora`` (a polyrl.modeling.lora.LoraPolicy whose model is ``policy``): only the adapter
        # trains, and weight syncs send merged weights.
        self.lora = lora
        # Dropout off in every pass, the update included, so that π_old and π_θ are the same
        # function of the weights (TRL's disable_dropout default; verl does the same).
        self.policy = policy.eval()
        self.objective = objective
        self.settings = settings
        self.critic = critic
        # One fused kernel over all parameters instead of a Python loop per tensor (TRL's default
        # optimizer, adamw_torch_fused); same update, same state dict.
        # Only trainable parameters: with LoRA the optimizer (and its checkpointed state) is the adapter's.
        self.optimizer = torch.optim.AdamW(
            [p for p in policy.parameters() if p.requires_grad],
            lr=settings.learning_rate,
            betas=settings.betas,
            weight_decay=settings.weight_decay,
            fused=True,
        )
        self.guard = NonFiniteGuard(settings.max_consecutive_nonfinite)
        self.entropy = EntropyController(settings.entropy_coef, settings.entropy_control)  # the bonus' coefficient
        self.optimizer_step = 0  # applied policy optimizer steps: the schedule's and the critic cadence's clock
        # The version of the weights it holds: updates that applied an optimizer step (0: as built).
        # The synchronous loop's syncs give the engine this number, which every sample then carries
        # (Completion.policy_version), so an update knows which rows its own weights sampled.
        self.weight_version = 0
        # The rollout inspector's per-token capture (learner/token_capture.py): asked for one update
        # at a time, so the other steps pay nothing.
        self._inspect_next = False
        self._capture: TokenCapture | None = None
        self._inspection: TokenCapture | None = None

    # --- schedule and state ----------------------------------------------------------------------

    def optimizer_steps_per_step(self) -> int:
        return self.settings.updates_per_batch * self.settings.mini_batches

    def learning_rate(self, optimizer_step: int) -> float:
        """The policy's learning rate at (1-based) optimizer step ``optimizer_step``."""
        s = self.settings
        return s.learning_rate * lr_factor(
            optimizer_step,
            schedule=s.lr_schedule,
            warmup_steps=s.warmup_steps,
            total_steps=s.total_steps * self.optimizer_steps_per_step(),
            min_lr_ratio=s.min_lr_ratio,
        )

    def apply_optimizer_settings(self) -> None:
        """The settings' hyper-parameters, also over those a checkpoint restored."""
        s = self.settings
        apply_optimizer_settings(
            self.optimizer, lr=self.learning_rate(self.optimizer_step + 1), betas=s.betas, weight_decay=s.weight_decay
        )
        if self.critic is not None:
            self.critic.apply_optimizer_settings()

    def state_dict(self) -> dict[str, Any]:
        state = {
            "optimizer_step": self.optimizer_step,
            "weight_version": self.weight_version,
            "nonfinite": self.guard.state_dict(),
        }
        if self.entropy.settings is not None:
            state["entropy"] = self.entropy.state_dict()
        if self.critic is not None:
            state["critic_nonfinite"] = self.critic.guard.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer_step = int(state["optimizer_step"])
        # A checkpoint from before the weight version was saved: one per training step's optimizer
        # steps (any number serves, as long as the resume's sync gives the engine the same).
        self.weight_version = int(state.get("weight_version", self.optimizer_step // max(self.optimizer_steps_per_step(), 1)))
        self.guard.load_state_dict(state.get("nonfinite", {}))
        self.entropy.load_state_dict(state.get("entropy", {}))
        if self.critic is not None:
            self.critic.guard.load_state_dict(state.get("critic_nonfinite", {}))

    def weights(self, dtype: torch.dtype) -> Iterator[tuple[str, Tensor]]:
        """The policy's weights in ``dtype`` (the rollout engine's), for a weight sync; with LoRA
        the base weights with the adapter folded in (new tensors; the learner's stay unmerged)."""
        if self.lora is not None:
            return self.lora.merged_weights(dtype)
        return ((name, tensor.detach().to(dtype)) for name, tensor in self.policy.state_dict().items())

    def write_adapter(self, folder: Any) -> None:
        """The LoRA adapter as a PEFT folder (``model.lora.sync: adapter``)."""
        if self.lora is None:
            raise RuntimeError("write_adapter: this learner trains no LoRA adapter")
        write_adapter(self.lora, folder)

    # --- the rollout inspector ----------------------------------------------------------------------

    def inspect_next_update(self) -> None:
        """Capture per-token values (:class:`TokenCapture`) in the next :meth:`update` only."""
        self._inspect_next = True

    def take_inspection(self, lengths: list[int]) -> list[dict[str, list[Any]]] | None:
        """The last update's captured values per row (``lengths``: each completion's token count),
        or None where it captured nothing; handed out once."""
        capture, self._inspection = self._inspection, None
        return None if capture is None else capture.rows(lengths)

    @torch.no_grad()
    def _learner_pass(self, batch: LearnerBatch) -> None:
        """π_θ's log-probs before the update's first optimizer step, for the capture: one no-grad
        pass over the batch (the inspector's steps only)."""
        s = self.settings
        with autocast(self.policy, s.compute_dtype):
            for start in range(0, len(batch.packed), s.micro_batch_size):
                part = trim_padding(batch.packed.select(slice(start, start + s.micro_batch_size)))
                logprobs, _ = self._token_logprobs(part, compute_entropy=False)
                self._capture.learner_logprobs(start, logprobs)

    # --- the update ---------------------------------------------------------------------------------

    def update(self, batch: LearnerBatch, step_index: int = 0, weight_version: int | None = None) -> dict[str, float]:
        """:meth:`_update`. A :class:`NonFiniteStop` part-way through ends the update there: its
        remaining optimizer steps are skipped, and the stop carries how many of its steps were
        applied (``applied_steps``), so that the loop saves the previous step (none applied: the
        learner is as it was then) or this one (some applied: done, the rest skipped). A copy of
        the weights and AdamW state to undo the applied steps is not needed, and none is made.

        ``weight_version``: the policy version the rows' ``policy_versions`` give the weights the
        learner holds now, where the loop numbers versions itself (the asynchronous loop: completed
        steps); by default :attr:`weight_version`, the number its syncs gave the engine."""
        if weight_version is None:
            weight_version = self.weight_version
        # The gradients' memory before any activation's, reused by every mini-batch (runtime/gradient_buffers.py).
        gradients = update_gradients(self.policy.parameters(), sharded=self.group.shards_parameters)
        start = self.optimizer_step
        self._inspection = None
        if self._inspect_next:
            self._inspect_next = False
            self._capture = TokenCapture(batch.packed.response_mask, batch.loss_mask, batch.advantages, batch.correction_rejected)
        try:
            metrics = self._update(batch, gradients, step_index, weight_version)
            metrics.update(self.entropy.observe(metrics.get("actor/entropy")))  # the next step's coefficient
            self._inspection = self._capture
            return metrics
        except NonFiniteStop as stop:
            stop.applied_steps = self.optimizer_step - start
            raise
        finally:
            if self.optimizer_step > start:  # the weights moved: a new version
                self.weight_version += 1
            self._capture = None
            # Freed now, not at the next update's start: dead until then, they would share the host
            # with the weight sync and the next generation.
            gradients.close()

    def _update(
        self, batch: LearnerBatch, gradients: GradientBuffers | AutogradGradients, step_index: int = 0, weight_version: int = 0
    ) -> dict[str, float]:
        """Several optimizer passes over the rollout batch, each split into mini-batches (one
        optimizer step each) whose gradients accumulate over micro-batches.

        The loss normaliser spans each mini-batch (all its micro-batches), not the whole rollout
        batch: a mini-batch's loss, hence its optimizer step, does not depend on how it is cut
        into micro-batches. An objective's ``prepare`` runs once per mini-batch for the same reason.
        ``step_index`` (training steps done) seeds the shuffle; ``weight_version`` (see :meth:`update`)
        picks the rows whose sampler/learner mismatch the first forward measures.
        """
        s = self.settings
        size = len(batch.packed)
        generator = torch.Generator().manual_seed(s.seed * 7919 + step_index)
        # Token means, ratios of sums and extremes, each combined as its meaning asks (algos/metric_parts.py).
        accumulated = MetricAccumulator()
        grad_norms, losses = [], []
        skipped: dict[str, int] = defaultdict(int)
        critic_updates = 0
        mismatch: dict[str, float] = defaultdict(float)
        learning_rate = self.learning_rate(self.optimizer_step + 1)
        shuffle = s.updates_per_batch > 1 or s.mini_batches > 1
        lengths = batch.packed.attention_mask.sum(dim=1)
        if s.share_prompts:
            prompts = row_prompts(batch.packed.input_ids, batch.packed.response_index)
            completion_lengths = completion_widths(batch.packed.response_mask)
            pack_cost_ratio = attention_cost_ratio(self.policy.get_decoder())
        # Micro-batch plans come from the host copy above (no device syncs); the tensors go to the
        # policy's device once here (a no-op on the CPU).
        batch = batch.to(next(self.policy.parameters()).device)
        diagnose, diagnosed_rows = rows_to_diagnose(batch, weight_version)
        if self._capture is not None:
            self._learner_pass(batch)
        for _ in range(s.updates_per_batch):
            order = torch.randperm(size, generator=generator) if shuffle else torch.arange(size)
            for mini in torch.tensor_split(order, s.mini_batches):
                if not batch.loss_mask[mini].any():
                    continue  # nothing trains here; momentum and weight decay alone must not move the weights
                # This rank's rows (all of them in one process); the normaliser is the whole
                # mini-batch's, its shards' counts summed over the ranks.
                shard = self.group.shard(mini, lengths)
                count = loss_normalizer_count(batch.loss_mask[shard], mode=s.aggregation, max_response_length=s.max_tokens)
                normalizer = max(self.group.sum(count), 1.0)
                # Over the whole mini-batch on every rank (each holds the batch): BAPO's bounds as in one process.
                prepared = self.prepare_objective(batch, mini)
                gradients.start_mini_batch()
                mini_loss = 0.0
                # Rows of similar length share a micro-batch, which then drops its padding columns (exact).
                # With shared prompts, micro-batches are made of whole packs (a prompt and its completions) instead.
                if s.share_prompts:
                    micro_batches = shared_prompt_micro_batches(
                        shard, prompts, completion_lengths, s.micro_batch_size, pack_cost_ratio
                    )
                elif s.micro_batch_tokens:
                    micro_batches = token_budget_micro_batches(
                        shard, lengths, s.micro_batch_size, s.micro_batch_tokens, padded=not s.padding_free
                    )
                else:
                    micro_batches = length_sorted_micro_batches(shard, lengths, s.micro_batch_size) if len(shard) else []
                micro_batches = list(micro_batches)
                # FSDP2: every rank runs as many forwards and backwards as the busiest (collectives in each).
                rounds = self.group.most(len(micro_batches)) if self.group.shards_parameters else len(micro_batches)
                for _ in range(rounds - len(micro_batches)):
                    self._zero_weight_pass(batch, mini[:1])
                for micro in micro_batches:
                    loss, metrics, logprobs = self.policy_loss(batch, micro, normalizer, prepared)
                    if diagnose is not None:
                        width = logprobs.shape[1]
                        compared = batch.packed.response_mask[micro][:, :width].bool() & diagnose[micro][:, None]
                        sampled = batch.packed.sampling_logprobs[micro][:, :width]
                        for key, value in mismatch_sums(logprobs.detach(), sampled, compared).items():
                            mismatch[key] += value
                    # No heap trim in here: handing pages back after a mini-batch's first backward made the
                    # next micro-batches fault them in again, for no lower peak (runtime/host_memory.py).
                    loss.backward()
                    mini_loss += float(loss.detach())
                    accumulated.add(metrics, float(batch.loss_mask[micro].sum()))
                # A parameter this mini-batch did not reach has no gradient, as without the buffers.
                gradients.drop_unreached()
                # Gradients and loss summed over the ranks: every rank clips by the global norm,
                # the guard sees the whole mini-batch's loss, and all apply the same step.
                self.group.reduce_gradients(self.policy.parameters())
                mini_loss = self.group.sum(mini_loss)
                grad_norm = self.group.clip_grad_norm(self.policy.parameters(), s.max_grad_norm)
                learning_rate = self.learning_rate(self.optimizer_step + 1)
                applied = guarded_step(self.optimizer, self.guard, mini_loss, grad_norm, skipped, learning_rate)
                self.optimizer_step += int(applied)
                diagnose = None  # the weights may have moved: no longer the sampler's
                grad_norms.append(grad_norm)
                losses.append(mini_loss)
                value_metrics = (
                    self.critic.after_policy_step(batch, mini, self.optimizer_step, skipped)
                    if self.critic is not None and applied
                    else None
                )
                if value_metrics is not None:
                    critic_updates += 1
                    accumulated.add(value_metrics, 1.0)
        combined = MetricAccumulator.merged(self.group.gather(accumulated.state())).result()
        mismatch, _, _ = self.group.merge_sums(mismatch, {}, 0.0)
        unprefixed = ("bapo/", "quadrant/", "value/", "rollout_corr/")
        out = {f"actor/{k}" if not k.startswith(unprefixed) else k: value for k, value in combined.items()}
        out.update(mismatch_from_sums(mismatch))  # rollout/logprob_gap and rollout_corr/*
        if diagnosed_rows:  # rows compared (all ranks), and why not the others: the health check says it once
            out.update({"rollout_corr/rows_measured": mismatch.get("rows", 0.0), **diagnosed_rows})
        out["actor/loss"] = float(np.mean(losses)) if losses else 0.0
        out["actor/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        out["actor/grad_norm_max"] = float(np.max(grad_norms)) if grad_norms else 0.0
        out["actor/learning_rate"] = learning_rate  # the rate of this step's last optimizer step
        out["actor/optimizer_steps"] = float(self.optimizer_step)
        out["health/nonfinite_steps"] = float(sum(skipped.values()))
        for reason in NONFINITE_REASONS:
            out[f"health/nonfinite_{reason}_steps"] = float(skipped.get(reason, 0))
        if self.critic is not None:
            out["value/updates"] = float(critic_updates)
        return out


def rows_to_diagnose(batch: LearnerBatch, weight_version: int) -> tuple[Tensor | None, dict[str, float]]:
    """The rows whose sampler/learner mismatch an update may measure in its first forward (those
    of its first mini-batch, before its first optimizer step), and the rows it may not, by why
    (``rollout_corr/rows_*``; the update adds ``rows_measured``, the rows it compared).

    Measurable: the rows sampled by the weights the learner holds, version ``weight_version`` (or
    with no version, ``-1``: an engine that stamps none, in the synchronous loop). Not: rows of an
    older version (``rows_older_weights``: asynchronous training; the learner no longer holds those
    weights) and of any other (``rows_other_version``: a numbering that disagrees with the
    learner's, a sync it did not count). None and no counts where the pipeline measured the
    mismatch already (π_old recomputed before the update, on every row)."""
    if "rollout/logprob_gap" in batch.metrics:
        return None, {}
    versions = batch.policy_versions
    if versions is None:
        return torch.ones(len(batch.packed), dtype=torch.bool, device=batch.advantages.device), {}
    measurable = (versions < 0) | (versions == weight_version)
    older = (versions >= 0) & (versions < weight_version)
    return measurable, {
        "rollout_corr/rows_older_weights": float(older.sum()),
        "rollout_corr/rows_other_version": float((~measurable & ~older).sum()),
    }
