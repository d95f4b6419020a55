"""DAPO's data-side pieces (Yu et al., arXiv 2503.14476): overlong punishment and dynamic
sampling (also exported by :mod:`polyrl.algos.advantages`)."""

from __future__ import annotations

import torch
from torch import Tensor

from polyrl.algos.groups import group_index


def dapo_overlong_penalty(lengths: Tensor, *, max_length: int, cache_length: int) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al., arXiv 2503.14476, Eq. 13), float [B].

    0 for ``L <= max_length - cache_length``; ``(max_length - cache_length - L) / cache_length``
    (linear from 0 to -1) up to ``L = max_length``; -1 beyond. ``cache_length = 0`` (not in the
    paper) degenerates to a hard step: 0 up to ``max_length``, -1 beyond. Floating ``lengths``
    keep their dtype (the ``length`` reward passes float64), integer ones become the default.
    Used on token ids by the learner's reward shaping and on re-tokenised text by the
    ``length`` reward.
    """
    if not 0 <= cache_length <= max_length:
        raise ValueError("need 0 <= cache_length <= max_length")
    lengths = lengths if lengths.is_floating_point() else lengths.to(torch.get_default_dtype())
    if cache_length == 0:
        return torch.where(lengths > max_length, -1.0, 0.0).to(lengths.dtype)
    soft_start = max_length - cache_length
    penalty = (soft_start - lengths) / cache_length
    return penalty.clamp(min=-1.0, max=0.0)


def dapo_dynamic_sampling_keep(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """DAPO dynamic sampling (arXiv 2503.14476, Eq. 11): bool [B], False for every sample of a
    group whose scored rewards are all equal (it has zero group-relative advantage, hence no
    gradient), and False for every unscored (NaN) sample; the scored samples of a group whose
    scored rewards differ are kept. Deviation: compares rewards exactly; a group of one scored
    sample is dropped."""
    inverse, num_groups = group_index(group_ids)
    scored = ~torch.isnan(rewards)
    group_max = torch.full((num_groups,), -torch.inf, dtype=rewards.dtype, device=rewards.device)
    group_min = torch.full((num_groups,), torch.inf, dtype=rewards.dtype, device=rewards.device)
    group_max = group_max.scatter_reduce(0, inverse, torch.where(scored, rewards, -torch.inf), reduce="amax")
    group_min = group_min.scatter_reduce(0, inverse, torch.where(scored, rewards, torch.inf), reduce="amin")
    return (group_max > group_min)[inverse] & scored
