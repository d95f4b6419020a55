"""Which ratio a rejection band bounds (docs/rollout_correction.md, "Which ratio a band bounds").

polyrl bounds ρ = π_target / π_sampler, as verl's maths document and IcePop define the band; verl's
code bounds the inverse (it thresholds k1 = −log ρ). An asymmetric band tells the two apart: these
tests pin polyrl's reading with values worked by hand, so a change to the other one fails here.
"""

from __future__ import annotations

import math

import torch

from polyrl.algos.rollout_correction import geometric_mask, icepop_mask, sequence_mis_mask

# One row of three tokens with ρ_t = 3, 1, 1 (log ρ = ln 3, 0, 0).
L3 = math.log(3.0)
LOG_RATIO = torch.tensor([[L3, 0.0, 0.0]])
MASK = torch.ones(1, 3, dtype=torch.bool)


def test_icepop_keeps_a_token_whose_ratio_lies_in_an_asymmetric_band():
    # Band [0.5, 5]: ρ = 3 lies inside, so every token is kept. verl's code at 0.5_5.0 keeps
    # 1/5 ≤ ρ ≤ 1/0.5, i.e. [0.2, 2], and would drop the first token (3 > 2).
    keep, _ = icepop_mask(LOG_RATIO, MASK, low=0.5, high=5.0)
    assert keep.tolist() == [[True, True, True]]
    # Band [1/5, 2] (verl's reading of 0.5_5.0, written as polyrl's band): ρ = 3 leaves it.
    keep, _ = icepop_mask(LOG_RATIO, MASK, low=0.2, high=2.0)
    assert keep.tolist() == [[False, True, True]]


def test_icepop_drops_a_token_below_an_asymmetric_band():
    # ρ_t = 1/3 = 0.333 on the first token: below 0.5 → dropped. Read as π_sampler/π_target it
    # would be 3, inside [0.5, 5], and kept.
    keep, _ = icepop_mask(-LOG_RATIO, MASK, low=0.5, high=5.0)
    assert keep.tolist() == [[False, True, True]]


def test_sequence_mis_bounds_the_product_of_target_over_sampler_ratios():
    # ∏ ρ_t = 3 · 1 · 1 = 3: inside [0.5, 4] → kept; the inverse 1/3 would leave it.
    keep, _ = sequence_mis_mask(LOG_RATIO, MASK, low=0.5, high=4.0)
    assert keep.all()
    keep, _ = sequence_mis_mask(-LOG_RATIO, MASK, low=0.5, high=4.0)  # ∏ ρ_t = 1/3 < 0.5 → dropped
    assert not keep.any()


def test_geometric_mask_bounds_the_geometric_mean_of_target_over_sampler_ratios():
    # Geometric mean 3^(1/3) = 1.442: inside [0.9, 1.5] → kept; the inverse 0.693 < 0.9 → dropped.
    keep, _ = geometric_mask(LOG_RATIO, MASK, low=0.9, high=1.5)
    assert keep.all()
    keep, _ = geometric_mask(-LOG_RATIO, MASK, low=0.9, high=1.5)
    assert not keep.any()
