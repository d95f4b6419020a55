"""pass@k: the chance that at least one of k samples is correct, estimated from n ≥ k samples.

Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (arXiv 2107.03374), §2.1:
draw n ≥ k samples per problem, count the c correct ones, and use the unbiased estimator

    pass@k = E_problems[ 1 − C(n − c, k) / C(n, k) ]

computed, as in the paper's Figure 3, as the numerically stable product
``1 − Π_{i = n−c+1}^{n} (1 − k / i)`` (the binomials overflow floats for large n).

Deviations from the paper: none in the estimator. Problems whose samples could not be scored
(no gold answer) are left out of the mean rather than counted as failures; the caller reports
how many were left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct samples out of ``n`` (Chen et al. 2021)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean pass@k over problems given as ``(n, c)`` pairs; NaN when there are none."""
    if not counts:
        return float("nan")
    return math.fsum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
