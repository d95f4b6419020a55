"""How a judge's output becomes a score: pure functions, no model.

Two readings of the rubric's allowed scores:

- **probabilities**: the judge's next-token distribution after the judge prompt, restricted to
  the allowed scores' tokens, gives the expected score ``Σ p(s)·s / Σ p(s)``. One forward pass,
  no sampling, and a smooth score (a 4 the judge nearly called a 5 scores near 4.5), as in
  "G-Eval: NLG Evaluation using GPT-4 with Better Human Alignment" (Liu et al., arXiv 2303.16634,
  §2.3, which weights each score by its probability). Deviation: G-Eval estimates the
  probabilities by sampling 20 times; here they are read from the logits exactly.
- **parsed**: the judge writes an answer and the first number in it is the score; a number
  that is not an allowed score, or no number, leaves the sample unscored.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import torch

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def expected_score(
    logits: torch.Tensor, score_token_ids: Sequence[int], scores: Sequence[float], *, min_mass: float
) -> tuple[float | None, float]:
    """``(expected score, probability mass on the score tokens)`` from one next-token ``logits``
    vector (vocabulary-sized); :func:`expected_score_from_logprobs` of the score tokens' float32
    ``log_softmax``."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return expected_score_from_logprobs(log_probs[list(score_token_ids)].tolist(), scores, min_mass=min_mass)


def expected_score_from_logprobs(
    score_logprobs: Sequence[float], scores: Sequence[float], *, min_mass: float
) -> tuple[float | None, float]:
    """``(expected score, probability mass on the score tokens)`` from the score tokens' next-token
    log-probabilities, normalised over the whole vocabulary (either engine gives these). The
    score is ``None`` when the mass is below ``min_mass``: the judge meant to write something
    other than a score, and renormalising a sliver of probability would invent one."""
    picked = torch.tensor(list(score_logprobs), dtype=torch.float64).exp()
    mass = float(picked.sum())
    if not math.isfinite(mass) or mass < min_mass or mass <= 0:
        return None, mass if math.isfinite(mass) else 0.0
    values = torch.tensor(list(scores), dtype=torch.float64)
    return float((picked * values).sum() / picked.sum()), mass


def parse_score(text: str, scores: Sequence[float]) -> float | None:
    """The first number in ``text`` when it is one of ``scores``, else ``None``."""
    match = NUMBER.search(text)
    if match is None:
        return None
    value = float(match.group())
    return value if any(math.isclose(value, s) for s in scores) else None


def groups_of(prompts: Sequence[str]) -> list[list[int]]:
    """Indices of consecutive samples that share a prompt: a prompt's G samples, as the rollout
    and ``RewardBatch.from_samples`` lay them out."""
    groups: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if groups and prompts[groups[-1][-1]] == prompt:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def numbered(completions: Sequence[str]) -> str:
    """A group's completions as the relative judge reads them: ``Answer 1: …`` one per block."""
    return "\n\n".join(f"Answer {k}: {text.strip()}" for k, text in enumerate(completions, start=1))
