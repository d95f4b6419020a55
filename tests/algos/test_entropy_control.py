"""Entropy controls (polyrl/algos/entropy_control.py), by hand."""

from __future__ import annotations

import pytest
import torch

from polyrl.algos.entropy_control import (
    AdaptiveEntropySettings,
    EntropyController,
    adaptive_entropy_coef,
    high_entropy_token_mask,
)


def test_the_coefficient_moves_toward_the_target_and_stays_in_its_range():
    # 0.01 + 0.1 × (1.0 − 0.4) = 0.07
    coef, m = adaptive_entropy_coef(0.01, 0.4, target=1.0, step_size=0.1, max_coef=1.0)
    assert coef == pytest.approx(0.07) and m["actor/entropy_target_gap"] == pytest.approx(0.6)
    # above the target it shrinks: 0.07 + 0.1 × (1.0 − 1.5) = 0.02; then clipped at 0
    assert adaptive_entropy_coef(0.07, 1.5, target=1.0, step_size=0.1, max_coef=1.0)[0] == pytest.approx(0.02)
    assert adaptive_entropy_coef(0.02, 3.0, target=1.0, step_size=0.1, max_coef=1.0)[0] == 0.0
    assert adaptive_entropy_coef(0.5, 0.0, target=1.0, step_size=1.0, max_coef=0.8)[0] == 0.8


def test_the_controller_steps_once_per_observation_and_round_trips():
    controller = EntropyController(0.0, AdaptiveEntropySettings(target=2.0, step_size=0.01, max_coef=0.1))
    assert controller.active
    controller.observe(1.0)  # 0 + 0.01 × 1 = 0.01
    controller.observe(1.5)  # 0.01 + 0.01 × 0.5 = 0.015
    assert controller.coef == pytest.approx(0.015)
    restored = EntropyController(0.0, controller.settings)
    restored.load_state_dict(controller.state_dict())
    assert restored.coef == controller.coef
    fixed = EntropyController(0.0)
    assert not fixed.active and fixed.observe(1.0) == {} and fixed.coef == 0.0


def test_high_entropy_tokens_keep_the_top_share():
    entropy = torch.tensor([[0.1, 2.0, 0.5, 9.0], [1.5, 0.2, 3.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    # 7 tokens in the mask (9.0 is padding); top 40%: ceil(2.8) = 3 → 3.0, 2.0, 1.5
    keep, m = high_entropy_token_mask(entropy, mask, top_ratio=0.4)
    assert keep.tolist() == [[False, True, False, False], [True, False, True, False]]
    assert m["high_entropy_kept_fraction"] == pytest.approx(3 / 7)
    assert m["high_entropy_threshold"] == pytest.approx(1.5)
    # ρ = 1 keeps every token of the mask
    assert high_entropy_token_mask(entropy, mask, top_ratio=1.0)[0].tolist() == mask.tolist()
