"""Policy objectives: pure tensor functions registered by name.

Every objective has the same call shape, so the learner looks one up by name and never branches
on it::

    spec = get_objective(name)
    params = {**spec.default_params, **config.objective.params,          # typed, validated
              "kl_coef": ..., "kl_estimator": ..., "entropy_coef": ...}  # from train.*
    extra = spec.prepare(logprobs_mb, old_mb, adv_mb, mask_mb, entropy=entropy_mb, **params) \
        if spec.prepare else {}                                          # once per mini-batch
    loss, metrics = spec.fn(
        logprobs, old_logprobs, advantages, mask,        # [B, T] each, one micro-batch
        loss_normalizer=global_loss_normalizer(mini_batch_mask, mode=aggregation),
        aggregation=aggregation,                         # one of AGGREGATION_MODES
        entropy=per_token_entropy_or_None,               # [B, T]
        **params, **extra,
    )

- ``mask`` is 1 on response tokens and 0 elsewhere; NaN/inf anywhere under ``mask == 0`` never
  reaches the loss or its gradient (inputs are zeroed with ``torch.where`` before any exp).
- ``advantages`` are token-level [B, T]; sequence-level advantages are broadcast by the caller
  (``adv[:, None] * mask``). Sequence objectives (``gspo``) take each row's masked mean.
- ``loss_normalizer`` is the denominator of the aggregation mode over the whole MINI-BATCH (the
  samples of one optimizer step, all its micro-batches and data-parallel ranks), computed once
  before its micro-batch loop (see :mod:`polyrl.algos.aggregation`), so the micro-batch
  losses simply add up to the mini-batch loss.
- ``prepare`` (BAPO, Clip-Cov and KL-Cov have one) makes batch-level choices over the whole mini-batch without
  gradient; its dict holds batch-level scalars only and goes unchanged to every micro-batch.
- The log-ratio ``log pi - log pi_old`` (and GSPO's sequence log-ratio) is clamped to +-20 before
  the exp, as verl does, so the ratio is always finite.
- Typed params: each registration declares a :class:`ObjectiveParams` model (``spec.params``),
  checked at config load; ``spec.default_params`` is its defaults as a dict. ``kl_coef``,
  ``kl_estimator`` and ``entropy_coef`` live in ``train.*`` (one home per setting): the
  functions accept them as keywords (``ref_logprobs`` [B, T] with ``kl_coef`` adds
  ``kl_coef * KL`` per token before aggregation; ``entropy_coef`` subtracts
  ``coef * entropy``), but they are not objective params. ``high_prob_threshold`` (default 0.5)
  splits the token quadrants.

Metrics (floats, no grad, over response tokens):
``clip_frac_low`` / ``clip_frac_high`` — share of response tokens whose gradient the lower bound
(A<0, ratio below it) / upper bound (A>0, ratio above it) zeroes; ``ratio_mean/min/max`` of the
ratio the objective clips (the sequence ratio, per token, for GSPO); ``approx_kl`` —
``(r - 1) - log r``, the k3 estimate of KL(pi_old || pi_theta), unbiased under the pi_old
samples the update trains on; ``entropy`` when given; ``kl`` when ``ref_logprobs`` is given;
``pos_loss_share`` — share of the aggregation-weighted |policy loss| mass carried by A>0 tokens
among A≠0 tokens (0 when there is no such mass); ``positive_share`` — BAPO's balance at the
objective's own bounds, ``pos / (pos + neg)`` of ``|r*A|`` over the tokens the clip keeps (A>0
with r at most the upper bound, A<0 with r at least the lower one; absent when none contributes),
so an arm without BAPO's search reports the share BAPO would steer; and the four token quadrants
(polyrl's own diagnostic), ``quadrant/{high,low}_prob_{pos,neg}_adv`` — shares of response tokens with A≠0, where
"high prob" means ``logprobs >= log(high_prob_threshold)``.

Per-token detail (the rollout inspector's steps only): called with the shared keyword
``inspect_tokens=True``, an objective's metrics also hold two tensors, popped by the caller
before it combines the floats: ``tokens/ratio`` (the ratio the objective clips, per token) and
``tokens/clipped`` (:func:`~.common.clip_removed_mask`: the tokens whose gradient the clip
removes, counted by ``clip_frac_low + clip_frac_high``; PPO's dual-capped tokens and Clip-Cov's
picked tokens are added, as ``dual_clip_frac`` and ``cov/selected_frac`` count them; absent for
objectives without a clip). The loss and the float metrics are the same either way.

Layout: :mod:`.registry` (specs, typed params), :mod:`.common` (shared pieces), one module per
family (:mod:`.ppo`: PPO, GRPO, Dr.GRPO, DAPO; :mod:`.gspo`; :mod:`.bapo`; :mod:`.reinforce`: CISPO,
GPG and the PPO-clip registrations named for their estimator, RLOO, REINFORCE++(-baseline),
ReMax; :mod:`.soft_gates`: SAPO, GMPO; :mod:`.covariance`: Clip-Cov, KL-Cov).
"""

# Import order is registration order, the order objectives are listed in (`polyrl objectives list`).
from polyrl.algos.objectives.ppo import ppo_loss  # noqa: I001 - registers ppo, grpo, dr_grpo, dapo
from polyrl.algos.objectives.gspo import gspo_loss, gspo_token_loss
from polyrl.algos.objectives.bapo import (
    bapo_loss,
    bapo_positive_share,
    bapo_prepare,
    bapo_search_clip_bounds,
    bapo_search_steps,
    entropy_adaptive_epsilon,
    positive_weight,
)

# The 2025-26 objectives.
from polyrl.algos.objectives.reinforce import cispo_loss, gpg_loss  # also rloo, reinforce_pp(_baseline), remax
from polyrl.algos.objectives.soft_gates import gmpo_loss, sapo_gate, sapo_loss
from polyrl.algos.objectives.covariance import clip_cov_loss, clip_cov_prepare, kl_cov_loss, kl_cov_prepare, token_covariance
from polyrl.algos.objectives.common import (
    LOG_RATIO_CLAMP,
    TOKEN_DETAIL,
    clip_removed_mask,
    ObjectiveInputs,
    approx_kl_old_to_new,
    clamped_log_ratio,
    clipped_surrogate_per_token,
    policy_metrics,
    sequence_advantages,
    sequence_log_ratio,
    token_ratio,
)
from polyrl.algos.objectives.registry import (
    SHARED_PARAMS,
    TRAIN_SETTINGS,
    ObjectiveFn,
    ObjectiveParams,
    ObjectiveSpec,
    get_objective,
    list_objectives,
    register_objective,
)

__all__ = [
    "LOG_RATIO_CLAMP", "TOKEN_DETAIL", "ObjectiveInputs", "clip_removed_mask", "SHARED_PARAMS", "TRAIN_SETTINGS", "ObjectiveFn", "ObjectiveParams", "ObjectiveSpec",
    "approx_kl_old_to_new", "bapo_loss", "bapo_positive_share", "bapo_prepare", "bapo_search_clip_bounds",
    "bapo_search_steps", "clamped_log_ratio", "clipped_surrogate_per_token", "entropy_adaptive_epsilon",
    "get_objective", "gspo_loss", "gspo_token_loss", "list_objectives", "policy_metrics",
    "positive_weight", "ppo_loss", "register_objective", "sequence_advantages", "sequence_log_ratio", "token_ratio",
    "cispo_loss", "clip_cov_loss", "clip_cov_prepare", "gmpo_loss", "gpg_loss", "kl_cov_loss", "kl_cov_prepare",
    "sapo_gate", "sapo_loss", "token_covariance",
]  # fmt: skip
