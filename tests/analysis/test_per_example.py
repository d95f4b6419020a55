"""Per-example comparisons (polyrl/analysis/per_example.py): flip tables counted by hand, and
the recipe-level (two-stage bootstrap) and checkpoint-level intervals checked by simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polyrl.analysis.per_example import (
    FlipCounts,
    checkpoint_difference,
    final_step_rows,
    flip_table,
    hierarchical_interval,
    mcnemar_exact_p,
    outcomes,
    paired_differences,
    prompt_snippets,
    top_flips,
)
from polyrl.analysis.stats import mean_interval


def _row(arm, seed, example, correct, *, step=10, dataset="d", prompt=None):
    return {
        "arm": arm,
        "seed": seed,
        "step": step,
        "dataset": dataset,
        "example_id": example,
        "correct": correct,
        "prompt": prompt or f"question {example}",
    }


def _hand_rows():
    # Seed 0, examples e1..e4 (one completion each):
    #   e1: a ✓ b ✓ -> both;  e2: a ✓ b ✗ -> only a;  e3: a ✗ b ✓ -> only b;  e4: a ✗ b ✗ -> neither
    # Seed 1, two completions per example (solved = more than half correct):
    #   e1: a ✓✓ (1.0) b ✓✗ (0.5, not solved) -> only a
    #   e2: a ✓✓ b ✓✓ -> both
    #   e3: a ✗✗ b ✓✓ -> only b;  e4: a ✓, b: only an unscored completion -> not shared, left out
    # Seed 1 also has a step-5 evaluation, which final_step_rows drops; seed 2 only arm a ran.
    rows = [
        _row("a", 0, "e1", True),
        _row("b", 0, "e1", True),
        _row("a", 0, "e2", True),
        _row("b", 0, "e2", False),
        _row("a", 0, "e3", False),
        _row("b", 0, "e3", True),
        _row("a", 0, "e4", False),
        _row("b", 0, "e4", False),
    ]
    rows += [_row("a", 1, "e1", True)] * 2 + [_row("b", 1, "e1", True), _row("b", 1, "e1", False)]
    rows += [_row("a", 1, "e2", True)] * 2 + [_row("b", 1, "e2", True)] * 2
    rows += [_row("a", 1, "e3", False)] * 2 + [_row("b", 1, "e3", True)] * 2
    rows += [_row("a", 1, "e4", True), _row("b", 1, "e4", None)]
    rows += [_row("a", 1, "e1", False, step=5), _row("b", 1, "e1", True, step=5)]
    rows += [_row("a", 2, "e1", True), _row("a", 1, "x", True, dataset="other")]
    return rows


def test_flip_table_counts_by_hand():
    data = outcomes(final_step_rows(_hand_rows()), "d")
    assert data["a"][1] == {"e1": 1.0, "e2": 1.0, "e3": 0.0, "e4": 1.0}  # the step-5 rows are gone
    assert data["b"][1] == {"e1": 0.5, "e2": 1.0, "e3": 1.0}  # e4's only completion had no verdict
    per_seed, pooled = flip_table(data, "a", "b")
    assert per_seed == {0: FlipCounts(both=1, only_a=1, only_b=1, neither=1), 1: FlipCounts(both=1, only_a=1, only_b=1)}
    # Pooled: both 1+1, only a 1+1, only b 1+1, neither 1+0; 7 example-seed pairs.
    assert pooled == FlipCounts(both=2, only_a=2, only_b=2, neither=1)
    assert pooled.examples == 7
    # The swapped pair swaps the discordant cells.
    assert flip_table(data, "b", "a")[1] == FlipCounts(both=2, only_a=2, only_b=2, neither=1)


def test_top_flips_rank_by_seeds():
    data = outcomes(final_step_rows(_hand_rows()), "d")
    fixed, broke = top_flips(data, "a", "b")
    # a beats b on e2 at seed 0 and on e1 at seed 1; b beats a on e3 at both seeds.
    assert [(f.example_id, f.seeds, f.of) for f in fixed] == [("e1", 1, 2), ("e2", 1, 2)]
    assert [(f.example_id, f.seeds, f.of) for f in broke] == [("e3", 2, 2)]
    assert prompt_snippets(_hand_rows(), width=8)["e1"] == "questio…"


def test_paired_differences_use_shared_examples():
    data = outcomes(final_step_rows(_hand_rows()), "d")
    differences = paired_differences(data, "a", "b")
    # Seed 0 (e1..e4): 0, 1, -1, 0; seed 1 (e1..e3): 1 - 0.5, 1 - 1, 0 - 1. Seed 2: arm b missing.
    assert sorted(differences) == [0, 1]
    assert differences[0].tolist() == [0.0, 1.0, -1.0, 0.0]
    assert differences[1].tolist() == [0.5, 0.0, -1.0]


def test_mcnemar_exact_by_hand():
    # 8 discordant examples favour a, 2 favour b: 2 · P(X ≤ 2 | Binomial(10, ½)) = 2 · (1 + 10 + 45) / 1024.
    assert mcnemar_exact_p(8, 2) == pytest.approx(112 / 1024)
    assert mcnemar_exact_p(0, 0) == 1.0
    result = checkpoint_difference(np.array([1.0, 1.0, 0.0, -1.0]), FlipCounts(only_a=2, only_b=1))
    assert result.interval.estimate == pytest.approx(0.25)
    assert result.interval.n == 4
    assert result.mcnemar_p == pytest.approx(1.0)  # 2 vs 1: 2 · P(X ≤ 1 | Binomial(3, ½)) = 2 · 4/8, capped at 1


def test_hierarchical_interval_without_evaluation_noise_is_the_paired_t_interval():
    # Each seed's differences are constant: no evaluation noise, the example stage draws the same
    # mean every time, and the interval is the Student-t interval of the seed means (up to the
    # bootstrap's own noise, ~1/√(2·2000) ≈ 1.6% of the standard error).
    differences = {0: np.full(50, 0.10), 1: np.full(40, 0.02), 2: np.full(60, 0.06), 3: np.full(30, -0.01)}
    interval = hierarchical_interval(differences)
    expected = mean_interval([0.10, 0.02, 0.06, -0.01])
    assert interval.estimate == pytest.approx(expected.estimate)
    assert interval.n == 4  # seeds are the replications, not the 180 examples
    assert interval.half_width == pytest.approx(expected.half_width, rel=0.05)
    assert hierarchical_interval(differences) == interval  # a fixed random stream
    one_seed = hierarchical_interval({0: np.array([1.0, 0.0])})
    assert math.isnan(one_seed.low) and one_seed.estimate == 0.5


def _simulated(rng, *, seeds, examples, seed_spread, shared_skill, shift=0.0):
    """Per seed, arm a's and b's 0/1 outcomes on the same examples. Each example has its own
    solve probability; each trained checkpoint moves it by its seed's skill (the same for both
    arms at a seed when ``shared_skill``: A/A with only evaluation noise; else each arm's own
    training noise); arm a adds ``shift`` (the true recipe difference in solve probability)."""
    base = rng.uniform(0.2, 0.7, examples)
    differences = {}
    for seed in range(seeds):
        skill = rng.normal(0, seed_spread)
        skill_a, skill_b = (skill, skill) if shared_skill else (rng.normal(0, seed_spread), rng.normal(0, seed_spread))
        a = rng.random(examples) < base + skill_a + shift
        b = rng.random(examples) < base + skill_b
        differences[seed] = a.astype(float) - b.astype(float)
    return differences


def test_hierarchical_interval_covers_the_true_difference():
    rng = np.random.default_rng(11)
    covered = 0
    for trial in range(200):
        differences = _simulated(rng, seeds=4, examples=80, seed_spread=0.04, shared_skill=False, shift=0.1)
        covered += hierarchical_interval(differences, resamples=500, seed=trial).contains(0.1)
    assert covered >= 0.92 * 200  # nominal 95%; the interval errs wide (t on 3 df), never narrow


@pytest.mark.parametrize("shared_skill", [True, False])
def test_a_a_hierarchical_interval_excludes_zero_rarely(shared_skill):
    """Two identical recipes at 3 seeds. With the same per-seed skill (only evaluation noise)
    and with each arm's own training noise (the checkpoints differ, the recipes do not), the
    recipe-level interval excludes 0 in at most ~5% of 200 experiments. The checkpoint-level
    interval of seed 0 excludes 0 about as rarely when only evaluation noise separates the arms,
    and far more often when the checkpoints differ: it answers another question."""
    rng = np.random.default_rng(5)
    recipe_excludes = checkpoint_excludes = 0
    for trial in range(200):
        differences = _simulated(rng, seeds=3, examples=100, seed_spread=0.08, shared_skill=shared_skill)
        recipe_excludes += not hierarchical_interval(differences, resamples=500, seed=trial).contains(0.0)
        at_seed_0 = checkpoint_difference(differences[0], FlipCounts(), resamples=500, seed=trial)
        checkpoint_excludes += not at_seed_0.interval.contains(0.0)
    assert recipe_excludes <= 0.06 * 200
    if shared_skill:
        assert checkpoint_excludes <= 0.09 * 200
    else:
        assert checkpoint_excludes >= 0.25 * 200
