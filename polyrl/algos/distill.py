"""On-policy distillation's per-token signal: the reverse KL to a teacher on the student's own tokens.

For a completion y sampled from the student π_s, the reverse KL KL(π_s ‖ π_t) of the sequence is
E_{y∼π_s}[Σ_t log π_s(y_t | y_<t) − log π_t(y_t | y_<t)]; its single-sample estimator at each
sampled token is ``log π_s(y_t) − log π_t(y_t)``. Used as a per-token reward with discount 0, the
advantage of token t is its own negative estimate, ``−coef × (log π_s(y_t) − log π_t(y_t))``:
tokens the teacher finds likelier than the student does are pushed up, the others down.

Papers: Agarwal et al., "On-Policy Distillation of Language Models: Learning from Self-Generated
Mistakes" (GKD, arXiv 2306.13649): the student learns on its own samples from the teacher's
per-token feedback (§3; reverse KL is GKD's divergence D = KL(π_s ‖ π_t) with on-policy data,
λ = 1). Thinking Machines, "On-Policy Distillation" (2025): the negative reverse KL per token as
the advantage, discount factor 0, with the sampler's log-probs as log π_s.

Deviations: GKD differentiates the full-vocabulary divergence at each position; this is the
single-sample score-function form of its reverse-KL case (as the write-up), so it needs the
teacher's log-prob of the sampled token only, and any policy-gradient objective applies it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyrl.algos.losses import masked_mean

__all__ = ["reverse_kl_advantages", "reverse_kl_metrics"]


def reverse_kl_metrics(reverse_kl: Tensor, mask: Tensor, teacher_logprobs: Tensor) -> dict[str, float]:
    """``distill/reverse_kl`` (mean over the masked tokens) with its 10th, 50th and 90th percentiles
    over those tokens, and ``distill/teacher_logprob`` (the teacher's mean log-prob of the student's tokens)."""
    mask = mask.bool()
    picked = reverse_kl[mask].double()
    if picked.numel():
        p10, p50, p90 = (float(v) for v in torch.quantile(picked, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)))
    else:
        p10 = p50 = p90 = 0.0
    return {
        "distill/reverse_kl": float(masked_mean(reverse_kl, mask)),
        "distill/reverse_kl_p10": p10,
        "distill/reverse_kl_p50": p50,
        "distill/reverse_kl_p90": p90,
        "distill/teacher_logprob": float(masked_mean(teacher_logprobs, mask)),
    }


def reverse_kl_advantages(
    student_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor, *, coef: float = 1.0
) -> tuple[Tensor, dict[str, float]]:
    """``(−coef × (log π_s − log π_t) on mask, 0 elsewhere; metrics)`` for ``[B, T]`` log-probs of the
    sampled tokens. ``mask`` holds the policy's tokens that train (an episode's observation tokens,
    which no policy sampled, are off it and get no term)."""
    mask = mask.bool()
    reverse_kl = torch.where(mask, student_logprobs.float() - teacher_logprobs.float(), torch.zeros((), dtype=torch.float32))
    return -coef * reverse_kl, reverse_kl_metrics(reverse_kl, mask, teacher_logprobs.float())
