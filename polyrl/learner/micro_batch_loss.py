"""The loss of one micro-batch, as the policy learner (:mod:`polyrl.learner.policy_learner`) computes it:
the policy's log-probs and entropy through the model (shared prompts, padding-free rows, inside
the FSDP2 root's forward where the policy is sharded), the objective's per-mini-batch
``prepare`` hook, bypass-mode rollout correction and forking-token selection applied to the
loss mask, the objective itself, and the zero-weight pass that keeps FSDP2 ranks in step.

The learner's update loop (mini-batches, micro-batches, normaliser, optimizer steps, the
non-finite guard) stays in :mod:`polyrl.learner.policy_learner`; this mixin holds what it asks of each
micro-batch, so the two read apart. It expects ``policy``, ``objective``, ``settings``,
``entropy`` and ``_capture`` on the learner.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from polyrl.algos.entropy_control import high_entropy_token_mask, selection_entropy_parts
from polyrl.algos.objectives.common import TOKEN_DETAIL
from polyrl.algos.rollout_correction import apply_correction
from polyrl.modeling.logprobs import token_logprobs
from polyrl.modeling.microbatches import trim_columns, trim_padding
from polyrl.rollout.batches import LearnerBatch
from polyrl.runtime.data_parallel import through_root
from polyrl.runtime.precision import autocast

__all__ = ["PolicyLoss"]


class PolicyLoss:
    """The per-micro-batch half of :class:`~polyrl.learner.policy_learner.PolicyLearner`."""

    policy: Any
    objective: Any
    settings: Any
    entropy: Any
    _capture: Any

    def _objective_params(self, batch: LearnerBatch, rows: Tensor) -> dict[str, Any]:
        s = self.settings
        params = {**s.objective_params, "kl_coef": s.kl_coef, "kl_estimator": s.kl_estimator, "entropy_coef": self.entropy.coef}
        if batch.ref_logprobs is not None:
            params["ref_logprobs"] = batch.ref_logprobs[rows]
        return params

    def _token_logprobs(self, packed: Any, **options: Any) -> tuple[Tensor, Tensor | None]:
        """:func:`token_logprobs` of the policy with the settings' temperature, shared prompts and
        padding-free rows; inside the FSDP2 root's forward where the policy is sharded
        (:func:`polyrl.runtime.data_parallel.through_root`)."""
        s = self.settings
        return through_root(
            self.policy,
            lambda: token_logprobs(
                self.policy,
                packed,
                temperature=s.temperature,
                share_prompts=s.share_prompts,
                padding_free=s.padding_free,
                **options,
            ),
        )

    def _zero_weight_pass(self, batch: LearnerBatch, rows: Tensor) -> None:
        """A forward and backward that add nothing to the gradients (weight 0), for an FSDP2 rank
        with fewer micro-batches in this mini-batch than another (a shard a row shorter, or empty):
        FSDP2 gathers parameters in every forward and reduces gradients in every backward, and every
        rank must join each of those collectives or all of them wait. verl evens its micro-batch
        counts across ranks likewise. ``rows``: any row of the batch (every rank holds it all)."""
        packed = trim_padding(batch.packed.select(rows))
        with autocast(self.policy, self.settings.compute_dtype):
            logprobs, _ = self._token_logprobs(packed, compute_entropy=False)
        (logprobs.sum() * 0.0).backward()

    @torch.no_grad()
    def prepare_objective(self, batch: LearnerBatch, mini: Tensor) -> dict[str, Any]:
        """The objective's once-per-mini-batch preparation (e.g. BAPO's clip-bound search) on
        the current policy's log-probs over the whole mini-batch, so that its result does not
        depend on the micro-batch size; ``{}`` for objectives without one."""
        prepare = getattr(self.objective, "prepare", None)
        if prepare is None:
            return {}
        s = self.settings
        packed = batch.packed.select(mini)
        parts = []
        with autocast(self.policy, s.compute_dtype):
            for start in range(0, len(packed), s.micro_batch_size):
                part = packed.select(slice(start, start + s.micro_batch_size))
                parts.append(self._token_logprobs(part, compute_entropy=True))
        logprobs = torch.cat([lp for lp, _ in parts])
        entropy = torch.cat([h for _, h in parts])
        old_logprobs = logprobs if batch.old_logprobs is None else batch.old_logprobs[mini]
        return dict(
            prepare(
                logprobs,
                old_logprobs,
                batch.advantages[mini],
                batch.loss_mask[mini],
                entropy=entropy,
                **self._objective_params(batch, mini),
            )
        )

    def policy_loss(self, batch: LearnerBatch, rows: Tensor, normalizer: float,
                    prepared: dict[str, Any] | None = None) -> tuple[Tensor, dict[str, float], Tensor]:  # fmt: skip
        s = self.settings
        packed = trim_padding(batch.packed.select(rows))
        width = packed.response_mask.shape[1]
        # The entropy takes part in the gradient only through an entropy bonus; else it is a metric.
        with autocast(self.policy, s.compute_dtype):
            logprobs, entropy = self._token_logprobs(packed, compute_entropy=True, entropy_grad=self.entropy.active)
        params = self._objective_params(batch, rows)
        if "ref_logprobs" in params:
            params["ref_logprobs"] = params["ref_logprobs"][:, :width]
        params.update(prepared or {})  # mini-batch-level values (e.g. BAPO's clip bounds), not per token
        advantages, loss_mask, old = trim_columns(
            width,
            [batch.advantages[rows], batch.loss_mask[rows], None if batch.old_logprobs is None else batch.old_logprobs[rows]],
        )
        old_logprobs = logprobs.detach() if old is None else old
        corrected: dict[str, float] = {}
        rejected = None
        if batch.in_update_correction is not None:
            # Bypass-mode rollout correction: its masks compare the current π_θ with the sampler.
            sampled = batch.packed.sampling_logprobs[rows][:, :width]
            before = loss_mask.bool()
            _, loss_mask, corrected = apply_correction(
                logprobs.detach() - sampled, loss_mask, advantages, settings=batch.in_update_correction, importance=False
            )
            rejected = before & ~loss_mask
        if s.high_entropy_top_ratio is not None:
            # Forking tokens (polyrl/algos/entropy_control.py): the rest of the tokens leave the loss.
            trained = loss_mask
            loss_mask, selected = high_entropy_token_mask(entropy, loss_mask, top_ratio=s.high_entropy_top_ratio)
            # actor/entropy stays the mean over every trained token (the adaptive coefficient steers on
            # it); the kept tokens' mean is actor/entropy_selected.
            corrected = {**corrected, **selected, **selection_entropy_parts(entropy, trained, loss_mask)}
        loss, metrics = self.objective.fn(
            logprobs,
            old_logprobs,
            advantages,
            loss_mask,
            loss_normalizer=normalizer,
            aggregation=s.aggregation,
            entropy=entropy,
            **params,
            **({"inspect_tokens": True} if self._capture is not None else {}),
        )
        if self._capture is not None:
            # The objective's per-token tensors (polyrl/algos/objectives/common.py) go to the capture, not the metrics.
            detail = {k.removeprefix(TOKEN_DETAIL): metrics.pop(k) for k in [k for k in metrics if k.startswith(TOKEN_DETAIL)]}
            self._capture.record(rows, detail, entropy=entropy, loss_mask=loss_mask, rejected=rejected)
        return loss, {**metrics, **corrected}, logprobs
