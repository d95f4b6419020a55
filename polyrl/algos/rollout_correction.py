"""Rollout correction: importance weights and rejection masks for a sampler that is not the learner.

The sampler (vLLM in bf16, another kernel, or older weights under ``rollout.max_staleness``)
gives each response token a log-prob ``log π_sampler``; the learner's ``log π_target`` differs.
Every function here takes ``log_ratio = log π_target − log π_sampler`` per token (``[N, T]``) and
the response ``mask``, and returns ``(weights_or_keep_mask, metrics)``. ``π_target`` is π_old
recomputed by the learner in the *decoupled* mode and the current π_θ (detached) in the *bypass*
mode (docs/rollout_correction.md).

Names and semantics follow verl's rollout correction (``docs/algo/rollout_corr.md``;
Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch"):

- token TIS (verl ``rollout_is: token``): ``w_t = min(ρ_t, C)``; truncated IS of Yao et al. 2025
  ("Your Efficient RL Framework Secretly Brings You Off-Policy RL Training").
- sequence TIS (``rollout_is: sequence``): ``w = min(∏_t ρ_t, C)`` on every token of the row.
- sequence MIS (verl ``seq_sum_k1``, its band read as the maths document reads it, below): rows
  whose ``∏_t ρ_t`` leaves ``[low, high]`` are masked.
- Geo-RS (verl ``seq_mean_k1``, likewise): rows whose geometric mean ``exp(mean_t log ρ_t)`` leaves the band.
- K3 rejection (verl ``seq_mean_k3``): rows whose mean ``k3 = ρ − 1 − log ρ`` exceeds a threshold.
- ICEPOP (verl ``token_k1`` with two bounds, likewise; IcePop of "Every Step Evolves: Scaling Reinforcement
  Learning for Trillion-Scale Thinking Model", Ring-1T, arXiv 2510.18855): tokens whose ρ_t leaves
  ``[low, high]`` are masked.
- OPSM ("DeepSeek-V3.2", arXiv 2512.02556, the "Off-Policy Sequence Masking" paragraph of its GRPO
  scaling section): rows with a negative advantage whose mean ``log π_sampler − log π_target``
  exceeds δ are masked.

As in verl, log-ratios are clamped to ±20 before ``exp`` (weights stay finite) and weights are 0
outside the mask. Deviation from verl: no batch normalisation of the weights, and no token veto
(ICEPOP's lower bound covers the catastrophic tokens per token rather than per row).

Which ratio a band bounds: every band here (``mis``, ``geometric``, ``icepop``) bounds ρ =
π_target/π_sampler, as verl's maths document writes the acceptance sets (``rollout_corr_math.md``,
"Rejection Sampling": ``C_RS-lower ≤ ρ_t ≤ C_RS-upper`` with ρ_t = π_old/π_rollout) and as IcePop
defines its mask (the training/inference ratio π_train/π_infer kept inside [α, β]). verl's code
(``rollout_corr_helper.compute_rollout_rejection_mask``, the ``*_k1`` options) thresholds
``k1 = −log ρ`` against ``[log lower, log upper]``, so it keeps ``1/upper ≤ ρ ≤ 1/lower``: it bounds
π_rollout/π_old. The two agree only for a band symmetric in log space (``low = 1/high``, which
verl's one-number thresholds and its default 0.5_2.0 are); for any other band pass verl's code
``1/high_1/low`` to reproduce polyrl's, e.g. ICEPOP ``{low: 0.5, high: 5}`` keeps 0.5 ≤ ρ ≤ 5
here while verl's ``token_k1`` at ``0.5_5.0`` keeps 0.2 ≤ ρ ≤ 2 (docs/rollout_correction.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

__all__ = [
    "SAFETY_BOUND",
    "CorrectionSettings",
    "apply_correction",
    "geometric_mask",
    "icepop_mask",
    "k3_mask",
    "mismatch_diagnostics",
    "mismatch_from_sums",
    "mismatch_sums",
    "opsm_mask",
    "sequence_mis_mask",
    "sequence_tis",
    "token_tis",
]

SAFETY_BOUND = 20.0  # |log ρ| cap before exp: e^20 ≈ 5e8, as verl


def _valid_rows(mask: Tensor) -> Tensor:
    return mask.any(dim=-1)


def _fractions(name: str, keep: Tensor, mask: Tensor) -> dict[str, float]:
    """Share of the mask's tokens dropped, and of its rows that lost at least one token."""
    mask = mask.bool()
    dropped = mask & ~keep
    rows = _valid_rows(mask)
    return {
        f"rollout_corr/{name}_masked_token_fraction": float(dropped.sum()) / max(float(mask.sum()), 1.0),
        f"rollout_corr/{name}_masked_seq_fraction": float((dropped.any(-1) & rows).sum()) / max(float(rows.sum()), 1.0),
    }


def _clamped(log_ratio: Tensor, mask: Tensor) -> Tensor:
    # Masked positions become 0 first, so padding (NaN, inf) reaches neither exp nor a sum.
    return torch.where(mask.bool(), log_ratio, torch.zeros_like(log_ratio)).clamp(-SAFETY_BOUND, SAFETY_BOUND)


def token_tis(log_ratio: Tensor, mask: Tensor, *, threshold: float) -> tuple[Tensor, dict[str, float]]:
    """Token-level truncated IS: ``min(exp(log ρ_t), threshold)``; 0 outside ``mask``."""
    mask = mask.bool()
    ratio = torch.exp(_clamped(log_ratio, mask))
    weights = torch.where(mask, ratio.clamp(max=threshold), torch.zeros_like(ratio))
    truncated = mask & (ratio > threshold)
    rows = _valid_rows(mask)
    return weights, {
        "rollout_corr/is_weight_mean": float(weights.sum()) / max(float(mask.sum()), 1.0),
        "rollout_corr/is_truncated_token_fraction": float(truncated.sum()) / max(float(mask.sum()), 1.0),
        "rollout_corr/is_truncated_seq_fraction": float((truncated.any(-1) & rows).sum()) / max(float(rows.sum()), 1.0),
    }


def sequence_tis(log_ratio: Tensor, mask: Tensor, *, threshold: float) -> tuple[Tensor, dict[str, float]]:
    """Sequence-level truncated IS: ``min(∏_t ρ_t, threshold)`` on every token of the row
    (the sum of log-ratios clamped to ±20, as verl's safety bound)."""
    mask = mask.bool()
    seq_log = _clamped(log_ratio, mask).sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    ratio = torch.exp(seq_log)
    seq_weight = ratio.clamp(max=threshold)
    weights = torch.where(mask, seq_weight[:, None].expand_as(log_ratio), torch.zeros_like(log_ratio))
    rows = _valid_rows(mask)
    truncated = rows & (ratio > threshold)
    n_rows = max(float(rows.sum()), 1.0)
    return weights, {
        "rollout_corr/is_weight_mean": float(seq_weight[rows].sum()) / n_rows,
        "rollout_corr/is_truncated_token_fraction": float(mask[truncated].sum()) / max(float(mask.sum()), 1.0),
        "rollout_corr/is_truncated_seq_fraction": float(truncated.sum()) / n_rows,
    }


def _row_mask(keep_rows: Tensor, mask: Tensor) -> Tensor:
    return mask.bool() & keep_rows[:, None]


def sequence_mis_mask(log_ratio: Tensor, mask: Tensor, *, low: float, high: float) -> tuple[Tensor, dict[str, float]]:
    """Sequence MIS: keep a row only if ``low ≤ ∏_t ρ_t ≤ high`` (compared in log space)."""
    seq_log = _clamped(log_ratio, mask).sum(-1)
    keep = _row_mask((seq_log >= torch.log(torch.tensor(low))) & (seq_log <= torch.log(torch.tensor(high))), mask)
    return keep, _fractions("mis", keep, mask)


def geometric_mask(log_ratio: Tensor, mask: Tensor, *, low: float, high: float) -> tuple[Tensor, dict[str, float]]:
    """Geo-RS: keep a row only if its geometric-mean ratio ``exp(mean_t log ρ_t)`` lies in ``[low, high]``
    (length-independent, so bands as tight as 0.999–1.001 are usable)."""
    mask = mask.bool()
    mean_log = _clamped(log_ratio, mask).sum(-1) / mask.sum(-1).clamp(min=1)
    keep = _row_mask((mean_log >= torch.log(torch.tensor(low))) & (mean_log <= torch.log(torch.tensor(high))), mask)
    return keep, _fractions("geo", keep, mask)


def k3_mask(log_ratio: Tensor, mask: Tensor, *, threshold: float) -> tuple[Tensor, dict[str, float]]:
    """K3 rejection: keep a row only if ``mean_t (ρ_t − 1 − log ρ_t) ≤ threshold`` (a per-row
    estimate of KL(π_sampler ‖ π_target), ≥ 0 token by token)."""
    mask = mask.bool()
    lr = _clamped(log_ratio, mask)
    k3 = torch.where(mask, torch.exp(lr) - 1.0 - lr, torch.zeros_like(lr))
    mean_k3 = k3.sum(-1) / mask.sum(-1).clamp(min=1)
    keep = _row_mask(mean_k3 <= threshold, mask)
    return keep, _fractions("k3", keep, mask)


def icepop_mask(log_ratio: Tensor, mask: Tensor, *, low: float, high: float) -> tuple[Tensor, dict[str, float]]:
    """ICEPOP: keep a token only if ``low ≤ ρ_t ≤ high``; the rest of its row still trains."""
    lr = _clamped(log_ratio, mask)
    keep = mask.bool() & (lr >= torch.log(torch.tensor(low))) & (lr <= torch.log(torch.tensor(high)))
    return keep, _fractions("icepop", keep, mask)


def opsm_mask(log_ratio: Tensor, mask: Tensor, advantages: Tensor, *, threshold: float) -> tuple[Tensor, dict[str, float]]:
    """DeepSeek-V3.2's off-policy sequence masking: drop a row when its advantage is negative and
    ``mean_t (log π_sampler − log π_target) > threshold``. Rows with a non-negative advantage always
    stay (the paper: learning from one's own positive samples is safe; negative ones far off-policy
    are what destabilises). The row's advantage is read off its first response token."""
    mask = mask.bool()
    mean_kl = (-_clamped(log_ratio, mask)).sum(-1) / mask.sum(-1).clamp(min=1)
    first = mask.float().argmax(-1)
    row_adv = advantages.gather(-1, first[:, None]).squeeze(-1)
    keep = _row_mask(~((row_adv < 0) & (mean_kl > threshold)), mask)
    return keep, _fractions("opsm", keep, mask)


# --- composition ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorrectionSettings:
    """What :func:`apply_correction` applies (the typed YAML block, objective.rollout_correction)."""

    is_level: str | None = None  # "token" | "sequence" | None
    is_threshold: float = 2.0
    mis: tuple[float, float] | None = None  # (low, high) on ∏ ρ_t
    geometric: tuple[float, float] | None = None  # (low, high) on the geometric mean
    k3_threshold: float | None = None
    icepop: tuple[float, float] | None = None  # (low, high) on ρ_t
    opsm_threshold: float | None = None

    @property
    def rejects(self) -> bool:
        return any(x is not None for x in (self.mis, self.geometric, self.k3_threshold, self.icepop, self.opsm_threshold))


def apply_correction(
    log_ratio: Tensor, mask: Tensor, advantages: Tensor, *, settings: CorrectionSettings, importance: bool = True
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """Every configured rejection (their keep-masks ANDed, as verl combines rejection options)
    and, with ``importance``, the IS weights: ``(weights [N, T] or ones, keep [N, T], metrics)``.
    ``rollout_corr/masked_token_fraction`` and ``masked_seq_fraction`` are the combined shares."""
    mask = mask.bool()
    keep = mask.clone()
    metrics: dict[str, float] = {}
    s = settings
    # Each configured rejection: its setting (a band or a threshold) and the mask it makes from it.
    parts: list[tuple[Any, Callable[[Any], tuple[Tensor, dict[str, float]]]]] = [
        (s.mis, lambda band: sequence_mis_mask(log_ratio, mask, low=band[0], high=band[1])),
        (s.geometric, lambda band: geometric_mask(log_ratio, mask, low=band[0], high=band[1])),
        (s.k3_threshold, lambda t: k3_mask(log_ratio, mask, threshold=t)),
        (s.icepop, lambda band: icepop_mask(log_ratio, mask, low=band[0], high=band[1])),
        (s.opsm_threshold, lambda t: opsm_mask(log_ratio, mask, advantages, threshold=t)),
    ]
    for setting, fn in parts:
        if setting is not None:
            part, part_metrics = fn(setting)
            keep &= part
            metrics.update(part_metrics)
    metrics.update({k.replace("/all_", "/"): v for k, v in _fractions("all", keep, mask).items()})
    weights = torch.where(mask, torch.ones_like(log_ratio), torch.zeros_like(log_ratio))
    if importance and s.is_level is not None:
        tis = token_tis if s.is_level == "token" else sequence_tis
        weights, is_metrics = tis(log_ratio, mask, threshold=s.is_threshold)
        metrics.update(is_metrics)
    return weights, keep, metrics


# --- always-on mismatch diagnostics ---------------------------------------------------------------


def mismatch_sums(learner_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """Numerators and counts of the sampler/learner mismatch over ``mask``'s tokens, to be summed
    over micro-batches and ranks and finished by :func:`mismatch_from_sums`.

    With ``log r = log π_learner − log π_sampler`` on tokens drawn from the sampler:
    k1 = −log r and k3 = r − 1 − log r both estimate KL(π_sampler ‖ π_learner) (J. Schulman,
    "Approximating KL Divergence", 2020); the log-perplexity difference is, per row,
    ``mean_t(−log π_learner) − mean_t(−log π_sampler)``, averaged over rows."""
    mask = mask.bool()
    lr = _clamped((learner_logprobs - sampler_logprobs).float(), mask)
    m = mask.float()
    rows = _valid_rows(mask)
    row_len = m.sum(-1).clamp(min=1)
    return {
        "tokens": float(m.sum()),
        "rows": float(rows.sum()),
        "abs_gap": float((lr.abs() * m).sum()),
        "k1": float((-lr * m).sum()),
        "k3": float(((torch.exp(lr) - 1.0 - lr) * m).sum()),
        "chi2": float(((torch.exp(2 * lr) - 1.0) * m).sum()),
        "log_ppl_diff": float(((-lr * m).sum(-1) / row_len)[rows].sum()),
    }


def mismatch_from_sums(sums: dict[str, float]) -> dict[str, float]:
    """The metrics from :func:`mismatch_sums`' totals; ``{}`` when no token was compared."""
    tokens, rows = sums.get("tokens", 0.0), sums.get("rows", 0.0)
    if tokens <= 0:
        return {}
    return {
        "rollout/logprob_gap": sums["abs_gap"] / tokens,
        "rollout_corr/kl": sums["k1"] / tokens,
        "rollout_corr/k3_kl": sums["k3"] / tokens,
        "rollout_corr/chi2_token": sums["chi2"] / tokens,
        "rollout_corr/log_ppl_diff": sums["log_ppl_diff"] / max(rows, 1.0),
        "rollout_corr/compared_tokens": tokens,
    }


def mismatch_diagnostics(learner_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """:func:`mismatch_sums` finished at once (one batch, one process)."""
    return mismatch_from_sums(mismatch_sums(learner_logprobs, sampler_logprobs, mask))
