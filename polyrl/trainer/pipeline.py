"""The batch pipeline: what happens between a scored rollout and the loss, as an ordered list of
small stages, each ``stage(batch, context) -> batch``.

Adding a step is adding a function to :data:`STAGES` (or to the list a caller passes to
:func:`run_pipeline`), not editing a method. A stage returns a new :class:`PipelineBatch`
(``dataclasses.replace``) with the fields it fills and its metrics added; the context holds
the settings and the models the stages read. The pipeline's input (rollout, scores) and
output (:class:`~polyrl.rollout.batches.LearnerBatch`) are plain data.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from polyrl.algos.advantages import AdvantageInputs, AdvantageSpec
from polyrl.algos.advantages.common import last_response_index
from polyrl.algos.advantages.gdpo import gdpo_advantages
from polyrl.algos.dapo_data import dapo_overlong_penalty
from polyrl.algos.distill import reverse_kl_advantages
from polyrl.algos.losses import kl_in_reward, kl_penalty, masked_mean, masked_mean_std
from polyrl.algos.rollout_correction import apply_correction, mismatch_diagnostics
from polyrl.config.distill import DistillConfig
from polyrl.config.objective import ModalitiesConfig, OverlongConfig, RolloutCorrectionConfig
from polyrl.modeling.batches import PackedBatch, pack_completions
from polyrl.modeling.logprobs import token_logprobs
from polyrl.rollout.batches import LearnerBatch, Rollout, Scores
from polyrl.runtime.precision import autocast

__all__ = [
    "BatchPipeline",
    "behaviour_logprobs",
    "PipelineBatch",
    "PipelineContext",
    "STAGES",
    "pipeline_stages",
    "run_pipeline",
    "teacher_advantages",
    "token_discounts",
]


@dataclass(frozen=True)
class PipelineContext:
    """What the stages read: settings, and the models whose log-probs or values they need."""

    estimator: AdvantageSpec
    estimator_params: dict[str, Any]
    pad_token_id: int
    policy: torch.nn.Module | None = None
    reference: torch.nn.Module | None = None
    # Entered around the reference's forward: with LoRA the reference is the policy itself and
    # this is PEFT's disable_adapter (the base model's function, no second copy of the weights).
    reference_scope: Callable[[], Any] | None = None
    values: Callable[[PackedBatch], Tensor] | None = None  # the critic's V(s_t), no grad
    compute_dtype: torch.dtype = torch.float32
    micro_batch_size: int = 8
    temperature: float = 1.0
    max_tokens: int = 64
    # π_old is read off the update's own first forward pass (one on-policy step per batch).
    reuse_old_logprobs: bool = True
    overlong: OverlongConfig | None = None  # advantage.overlong: mode, max_length, cache_length, penalty_weight
    kl_coef: float = 0.0
    kl_estimator: str = "k1"
    kl_in_reward: bool = False
    tis_cap: float | None = None  # truncated importance sampling's C; None: off
    modalities: ModalitiesConfig | None = None  # per-modality GAE settings (config.modalities)
    share_prompts: bool = False  # π_old and reference log-probs packed per prompt, as the learner's (train.share_prompts)
    padding_free: bool = False  # π_old and reference log-probs from rows end to end, as the learner's (train.padding_free)
    # Asynchronous training (rollout.max_staleness > 0): a sample may come from an older policy
    # than the learner's, so π_old is the behaviour policy, the sampler's log-probs (old_logprobs).
    behaviour_logprobs: bool = False
    rollout_correction: RolloutCorrectionConfig | None = None  # objective.rollout_correction; None: no correction
    # advantage.reward_aggregation 'gdpo': each reward's weight by label; the advantage comes from each
    # reward's raw scores (Scores.per_module, polyrl/algos/advantages/gdpo.py). None ('sum'): from the total.
    decoupled_reward_weights: dict[str, float] | None = None
    # distill: the teacher term's weight and whether the task reward's advantage stays (teacher_advantages).
    distill: DistillConfig | None = None


@dataclass
class PipelineBatch:
    rollout: Rollout
    scores: Scores
    packed: PackedBatch | None = None
    rewards: Tensor | None = None  # [N] sequence rewards; NaN = unscored
    token_rewards: Tensor | None = None  # [N, T] when the KL penalty is folded into the rewards
    excluded: Tensor | None = None  # [N] rows that must not train
    loss_mask: Tensor | None = None
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    values: Tensor | None = None
    gammas: Tensor | None = None
    lambdas: Tensor | None = None
    advantages: Tensor | None = None
    returns: Tensor | None = None
    in_update_correction: Any = None  # bypass mode's masks, applied by the learner (LearnerBatch)
    correction_rejected: Tensor | None = None  # a decoupled correction's rejected tokens (LearnerBatch)
    metrics: dict[str, float] = field(default_factory=dict)

    def with_metrics(self, metrics: dict[str, float], **fields: Any) -> "PipelineBatch":
        return replace(self, metrics={**self.metrics, **metrics}, **fields)


@torch.no_grad()
def _batched(fn: Callable[[PackedBatch], Tensor], packed: PackedBatch, model: torch.nn.Module, ctx: PipelineContext) -> Tensor:
    size = ctx.micro_batch_size
    with autocast(model, ctx.compute_dtype):
        # Back on the batch's device: the pipeline computes on the CPU whatever the learner's device.
        return torch.cat([fn(packed.select(slice(i, i + size))) for i in range(0, len(packed), size)]).to(packed.input_ids.device)


def _logprobs(model: torch.nn.Module, packed: PackedBatch, ctx: PipelineContext) -> Tensor:
    return _batched(
        lambda b: token_logprobs(
            model, b, temperature=ctx.temperature, share_prompts=ctx.share_prompts, padding_free=ctx.padding_free
        )[0],
        packed,
        model,
        ctx,
    )


# --- the stages, in order ------------------------------------------------------------------------


def pack(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    return replace(b, packed=pack_completions(b.rollout.completions, pad_token_id=ctx.pad_token_id))


def _decoupled(ctx: PipelineContext) -> bool:
    return ctx.rollout_correction is not None and ctx.rollout_correction.mode == "decoupled"


def old_logprobs(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    correction = ctx.rollout_correction
    if correction is not None and correction.mode == "bypass":
        # Bypass (verl bypass_mode): the sampler's log-probs are π_old, never recomputed; the
        # learner compares its first forward with them (the mismatch diagnostics).
        return b.with_metrics({}, old_logprobs=behaviour_logprobs(b.rollout.completions, b.packed))
    if ctx.behaviour_logprobs and ctx.tis_cap is None and not _decoupled(ctx):
        # Off-policy (asynchronous) training: the ratio is π_θ / π_behaviour, so clipping and
        # BAPO's bounds see the real staleness. With truncated importance sampling π_old is instead
        # the learner's current policy (recomputed below) and the TIS weight min(π_old/π_sampler, C)
        # carries the staleness: decoupled PPO (Hilton et al. 2021; AReaL, Fu et al. 2025).
        return b.with_metrics({}, old_logprobs=behaviour_logprobs(b.rollout.completions, b.packed))
    if ctx.reuse_old_logprobs and not _decoupled(ctx):
        return b
    # Decoupled correction needs π_old before the update (its weights compare it with the sampler).
    old = _logprobs(ctx.policy, b.packed, ctx)
    if ctx.behaviour_logprobs:
        # Asynchronous: rows sampled at older weights would measure their staleness, not the sync;
        # the learner compares its first forward with the rows sampled at its own weights instead.
        return b.with_metrics({}, old_logprobs=old)
    return b.with_metrics(mismatch_diagnostics(old, b.packed.sampling_logprobs, b.packed.response_mask.bool()), old_logprobs=old)


def behaviour_logprobs(completions: Sequence[Any], packed: PackedBatch) -> Tensor:
    """The sampler's log-probs of ``packed`` as π_old; refused where an engine gave none (packed
    as zeros, they would read as probability 1)."""
    missing = [row for row, c in enumerate(completions) if c.completion_ids and not c.sampling_logprobs]
    if missing:
        raise ValueError(f"rollout.max_staleness > 0 trains on the sampler's log-probs, but completions {missing[:5]} have none")
    return packed.sampling_logprobs.clone()


def _as_rewards(values: Sequence[float | None]) -> Tensor:
    return torch.tensor([math.nan if t is None else float(t) for t in values], dtype=torch.float32)


def sequence_rewards(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    # Unscored rewards reach the estimator as NaN: it leaves them out of group statistics and
    # gives them no advantage; their rows then leave the loss (loss_mask).
    rewards = _as_rewards(b.scores.totals)
    unscored = torch.isnan(rewards)
    return b.with_metrics({"reward/unscored_samples": float(unscored.sum())}, rewards=rewards, excluded=unscored.clone())


def overlong_penalty(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    overlong = ctx.overlong
    if overlong is None or overlong.mode != "soft_punishment":
        return b
    lengths = b.packed.response_mask.bool().sum(-1)
    penalty = dapo_overlong_penalty(lengths, max_length=overlong.max_length or ctx.max_tokens, cache_length=overlong.cache_length)
    return b.with_metrics(
        {"reward/overlong_penalty_mean": float(penalty.mean())},
        rewards=b.rewards + overlong.penalty_weight * penalty.to(b.rewards.dtype),
    )


def loss_mask(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    excluded, metrics = b.excluded, {}
    if ctx.overlong is not None and ctx.overlong.mode == "mask_truncated":
        # DAPO's overlong filtering (arXiv 2503.14476, §3.4): truncated samples keep their
        # place in group statistics but their tokens leave the loss entirely.
        truncated = torch.tensor([c.truncated for c in b.rollout.completions], dtype=torch.bool)
        excluded = excluded | truncated
        metrics["rollout/masked_truncated"] = float(truncated.sum())
    return b.with_metrics(metrics, excluded=excluded, loss_mask=b.packed.response_mask.bool() & ~excluded[:, None])


def ref_logprobs(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    if ctx.reference is None:
        return b
    with ctx.reference_scope() if ctx.reference_scope is not None else contextlib.nullcontext():
        ref = _logprobs(ctx.reference, b.packed, ctx)
    # Sampler log-probs stand in for π_old when the update supplies it (equal to ~1e-6).
    current = b.old_logprobs if b.old_logprobs is not None else b.packed.sampling_logprobs
    ref_kl = float(masked_mean(kl_penalty(current, ref, estimator=ctx.kl_estimator), b.loss_mask))
    return b.with_metrics({"actor/ref_kl": ref_kl}, ref_logprobs=ref)


def fold_kl_into_rewards(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    """KL in the reward (InstructGPT placement): the sequence reward on its last token, minus
    ``kl_coef`` × KL(π_old ‖ π_ref) on every token."""
    if not ctx.kl_in_reward or b.ref_logprobs is None:
        return b
    mask = b.packed.response_mask.bool()
    last = last_response_index(mask).clamp(min=0)  # an episode's mask has holes: not its sum - 1
    placed = torch.zeros(mask.shape, dtype=b.rewards.dtype)
    placed[torch.arange(len(b.rewards)), last] = b.rewards
    shaped, metrics = kl_in_reward(placed, b.old_logprobs, b.ref_logprobs, mask, kl_coef=ctx.kl_coef, estimator=ctx.kl_estimator)
    return b.with_metrics(metrics, token_rewards=shaped)


def values(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    return b if ctx.values is None else replace(b, values=ctx.values(b.packed).to(b.packed.input_ids.device))


def token_discounts(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    """Per-token γ and λ from each completion token's modality (polyrl's own design), read from
    ``Completion.completion_token_modalities`` ("text" unless an engine marks otherwise)."""
    settings = ctx.modalities
    shape = b.packed.response_mask.shape
    gammas = torch.full(shape, settings.text.gamma)
    lambdas = torch.full(shape, settings.text.lam)
    for row, completion in enumerate(b.rollout.completions):
        for t, modality in enumerate(completion.completion_token_modalities):
            if modality == "text":
                continue
            if modality not in type(settings).model_fields:  # the modalities config has one field per modality
                raise ValueError(
                    f"completion token modality {modality!r} has no GAE setting; modalities: {', '.join(type(settings).model_fields)}"
                )
            setting = getattr(settings, modality)
            gammas[row, t], lambdas[row, t] = setting.gamma, setting.lam
    return replace(b, gammas=gammas, lambdas=lambdas)


def advantages(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    estimator = ctx.estimator
    inputs = AdvantageInputs(
        rewards=b.token_rewards if b.token_rewards is not None else b.rewards,
        mask=b.packed.response_mask,
        group_ids=b.rollout.group_ids,
        values=b.values,
        gammas=b.gammas,
        lambdas=b.lambdas,
        baselines=None if b.scores.baselines is None else _as_rewards(b.scores.baselines),
    )
    if ctx.decoupled_reward_weights is not None:
        eps = ctx.estimator_params.get("eps", 1e-6)
        adv, adv_metrics = gdpo_advantages(
            b.scores.per_module, ctx.decoupled_reward_weights, b.rollout.group_ids, inputs.mask, eps=eps
        )
    else:
        adv, adv_metrics = estimator.fn(inputs, **ctx.estimator_params)
    returns = None
    if estimator.value_targets is not None:
        returns, _ = estimator.value_targets(inputs, **{k: v for k, v in ctx.estimator_params.items() if k == "whiten"})
        returns = torch.where(b.loss_mask, returns, torch.zeros_like(returns))
    metrics = {k if k.startswith("advantage/") else f"advantage/{k.split('/', 1)[-1]}": v for k, v in adv_metrics.items()}
    return b.with_metrics(metrics, advantages=torch.where(b.loss_mask, adv, torch.zeros_like(adv)), returns=returns)


def teacher_advantages(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    """On-policy distillation (config distill:, polyrl/algos/distill.py): each policy token's advantage
    gets −coef × (log π_student − log π_teacher), the student's log-probs being the sampler's (the
    policy that drew the tokens) and the teacher's those the collector stored on the rows
    (``Completion.teacher_logprobs``). Added to the estimator's advantages, or with
    ``task_reward: false`` the whole advantage (:func:`pipeline_stages` then leaves the estimator out).
    Before the importance weights and rollout correction, which then weigh the teacher term too."""
    if ctx.distill is None:
        return b
    completions = b.rollout.completions
    unscored = [row for row, c in enumerate(completions) if c.completion_ids and not c.teacher_logprobs]
    unsampled = [row for row, c in enumerate(completions) if c.completion_ids and not c.sampling_logprobs]
    if unscored or unsampled:
        raise ValueError(
            f"distill: completions {(unscored or unsampled)[:5]} carry no "
            + ("teacher log-probs (collected without the teacher)" if unscored else "sampler log-probs (the student's side)")
        )
    teacher = torch.zeros(b.packed.response_mask.shape, dtype=torch.float32)
    for row, c in enumerate(completions):
        teacher[row, : len(c.teacher_logprobs)] = torch.as_tensor(c.teacher_logprobs, dtype=torch.float32)
    term, metrics = reverse_kl_advantages(b.packed.sampling_logprobs, teacher, b.loss_mask, coef=ctx.distill.coef)
    advantages = term if not ctx.distill.task_reward else b.advantages + term
    return b.with_metrics(metrics, advantages=torch.where(b.loss_mask, advantages, torch.zeros_like(advantages)))


def truncated_importance_sampling(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    """Truncated importance sampling (Yao et al. 2025): weight each token by
    min(π_learner/π_sampler, C), folded into the (detached) advantage."""
    if ctx.tis_cap is None:
        return b
    weight = torch.exp(b.old_logprobs - b.packed.sampling_logprobs).clamp(max=ctx.tis_cap)
    return b.with_metrics(
        {"rollout/tis_weight_mean": float(masked_mean(weight, b.loss_mask))},
        advantages=torch.where(b.loss_mask, b.advantages * weight, b.advantages),
    )


def rollout_correction(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    """objective.rollout_correction (polyrl/algos/rollout_correction.py). Decoupled: the weights
    (π_old/π_sampler, truncated) fold into the detached advantage as truncated_importance_sampling's
    do, and the rejected tokens leave the loss mask, hence the loss normaliser. Bypass: nothing here;
    the learner applies the masks with the current π_θ. The combined masked shares are logged in every
    run (0 without a correction)."""
    correction = ctx.rollout_correction
    none_masked = {"rollout_corr/masked_token_fraction": 0.0, "rollout_corr/masked_seq_fraction": 0.0}
    if correction is None:
        return b.with_metrics(none_masked)
    if correction.mode == "bypass":
        settings = correction.settings()
        return b.with_metrics(none_masked, in_update_correction=settings if settings.rejects else None)
    weights, keep, metrics = apply_correction(
        b.old_logprobs - b.packed.sampling_logprobs, b.loss_mask, b.advantages, settings=correction.settings()
    )
    advantages = torch.where(keep, b.advantages * weights, torch.zeros_like(b.advantages))
    return b.with_metrics(metrics, advantages=advantages, loss_mask=keep, correction_rejected=b.loss_mask & ~keep)


def advantage_stats(b: PipelineBatch, ctx: PipelineContext) -> PipelineBatch:
    mean, std = (float(v) for v in masked_mean_std(b.advantages, b.loss_mask))
    picked = b.advantages[b.loss_mask]
    max_abs_z = float(((picked - mean).abs() / (std + 1e-8)).max()) if picked.numel() else 0.0
    return b.with_metrics({"advantage/mean": mean, "advantage/std": std, "advantage/max_abs_z": max_abs_z})


Stage = Callable[[PipelineBatch, PipelineContext], PipelineBatch]

STAGES: tuple[Stage, ...] = (
    pack,
    old_logprobs,
    sequence_rewards,
    overlong_penalty,
    loss_mask,
    ref_logprobs,
    fold_kl_into_rewards,
    values,
    token_discounts,
    advantages,
    teacher_advantages,
    truncated_importance_sampling,
    rollout_correction,
    advantage_stats,
)


def pipeline_stages(distill: DistillConfig | None) -> tuple[Stage, ...]:
    """:data:`STAGES` for a run: pure distillation (``distill.task_reward: false``) leaves the reward
    estimator's stage out, so the teacher term is the whole advantage."""
    if distill is not None and not distill.task_reward:
        return tuple(stage for stage in STAGES if stage is not advantages)
    return STAGES


class BatchPipeline:
    """:data:`STAGES` (or ``stages``) over ``context``: a scored rollout in, a learner batch out."""

    def __init__(self, context: PipelineContext, stages: Sequence[Stage] = STAGES):
        self.context = context
        self.stages = tuple(stages)

    def run(self, rollout: Rollout, scores: Scores) -> LearnerBatch:
        return run_pipeline(rollout, scores, self.context, self.stages)


def run_pipeline(rollout: Rollout, scores: Scores, ctx: PipelineContext, stages: Sequence[Stage] = STAGES) -> LearnerBatch:
    batch = PipelineBatch(rollout, scores)
    for stage in stages:
        batch = stage(batch, ctx)
    # Prompt and completion tokens of the rows the learner trains on (compute/learner_tokens).
    batch.metrics["train/tokens"] = float(batch.packed.attention_mask.sum())
    return LearnerBatch(
        packed=batch.packed,
        old_logprobs=batch.old_logprobs,
        advantages=batch.advantages.detach(),
        ref_logprobs=batch.ref_logprobs,
        old_values=batch.values,
        returns=batch.returns,
        metrics=batch.metrics,
        loss_mask=batch.loss_mask,
        policy_versions=torch.tensor(
            [-1 if c.policy_version is None else int(c.policy_version) for c in rollout.completions],
            dtype=torch.long,
        ),
        in_update_correction=batch.in_update_correction,
        correction_rejected=batch.correction_rejected,
    )
