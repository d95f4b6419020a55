"""The sequential rule: Lan–DeMets boundaries against hand arithmetic, published constants, scipy's
multivariate normal and Monte Carlo; the repeated intervals by hand; and THE SIMULATION: under
optional stopping after every round the false "different" and false "equivalent" rates stay at
or below alpha (normal and bounded, discrete accuracies)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats as scipy_stats

from polyrl.analysis.sequential import (
    SequentialPlan,
    SequentialPlanError,
    decide,
    history,
    sequential_outcomes,
)
from polyrl.analysis.sequential_boundaries import (
    crossing_probabilities,
    nominal_t_boundaries,
    spending_boundaries,
    spending_function,
    t_spending_boundaries,
)

ALPHA = 0.05


def _within(share: float, limit: float, experiments: int) -> bool:
    """``share ≤ limit + 3 SE`` with SE the binomial standard error of a share ``limit``."""
    return share <= limit + 3 * math.sqrt(limit * (1 - limit) / experiments)


# ---- spending functions and boundaries ----------------------------------------------------


def test_spending_at_half_the_information():
    # O'Brien–Fleming-type: 2 − 2Φ(z_{0.975} / √0.5) = 2 − 2Φ(1.959964 / 0.707107) = 2 − 2Φ(2.771808)
    # = 2 × 0.0027873 = 0.0055746.
    assert spending_function("obrien_fleming", ALPHA)(0.5) == pytest.approx(0.0055746, abs=1e-7)
    # Pocock-type: 0.05 · ln(1 + (e − 1)/2) = 0.05 · ln(1.859141) = 0.05 × 0.620115 = 0.0310057.
    assert spending_function("pocock", ALPHA)(0.5) == pytest.approx(0.0310057, abs=1e-7)
    for name in ("obrien_fleming", "pocock"):
        assert spending_function(name, ALPHA)(1.0) == pytest.approx(ALPHA, abs=1e-12)
    with pytest.raises(ValueError, match="obrien_fleming, pocock"):
        spending_function("haybittle", ALPHA)


def test_two_looks_against_the_spent_alpha_and_scipys_multivariate_normal():
    z1, z2 = spending_boundaries((0.5, 1.0), ALPHA, "obrien_fleming")
    # The first look spends 0.0055746 (above): z_1 = Φ⁻¹(1 − 0.0055746 / 2) = 2.771808 (= 1.959964 / √0.5).
    assert z1 == pytest.approx(2.771808, abs=1e-5)
    # Both looks together spend 0.05: P(|Z1| < z1, |Z2| < z2) = 0.95 with Corr(Z1, Z2) = √(0.5/1),
    # by scipy's (Genz) bivariate normal, an integration independent of the module's.
    normal = scipy_stats.multivariate_normal(
        mean=[0, 0], cov=[[1, math.sqrt(0.5)], [math.sqrt(0.5), 1]], seed=1, abseps=1e-9, releps=1e-9
    )
    assert 1 - normal.cdf([z1, z2], lower_limit=[-z1, -z2]) == pytest.approx(ALPHA, abs=1e-6)
    assert z2 == pytest.approx(1.97931, abs=1e-4)


def test_three_unequal_looks_against_scipys_trivariate_normal():
    t = (0.25, 0.6, 1.0)
    z = spending_boundaries(t, ALPHA, "pocock")
    covariance = [[math.sqrt(min(a, b) / max(a, b)) for b in t] for a in t]  # Brownian motion: √(t_i / t_j)
    spend = spending_function("pocock", ALPHA)
    for k in (2, 3):  # the first k looks together spend α(t_k)
        # Genz's quasi-Monte Carlo integration: a fixed seed and a tolerance far below the default 1e-5.
        normal = scipy_stats.multivariate_normal(
            mean=[0] * k, cov=[row[:k] for row in covariance[:k]], seed=1, maxpts=5_000_000, abseps=1e-9, releps=1e-9
        )
        inside = normal.cdf(z[:k], lower_limit=[-b for b in z[:k]])
        assert 1 - inside == pytest.approx(spend(t[k - 1]), abs=1e-6)


@pytest.mark.parametrize(
    "constants, shape",
    [
        # Jennison & Turnbull (2000), Table 2.1: Pocock's C_P(K, 0.05), one boundary at every look.
        ({2: 2.178, 3: 2.289, 4: 2.361, 5: 2.413}, lambda c, K, k: c),
        # Ibid., ch. 2: O'Brien & Fleming's C_B(K, 0.05), boundary C_B √(K / k) at look k.
        ({2: 1.977, 3: 2.004, 4: 2.024, 5: 2.040}, lambda c, K, k: c * math.sqrt(K / k)),
    ],
    ids=["pocock", "obrien_fleming"],
)
def test_the_integration_gives_the_published_classic_boundaries_their_alpha(constants, shape):
    # The constants are rounded to 3 decimals, which moves the error rate by up to ~1e-4.
    for K, c in constants.items():
        boundaries = [shape(c, K, k) for k in range(1, K + 1)]
        assert sum(crossing_probabilities(boundaries, [k / K for k in range(1, K + 1)])) == pytest.approx(ALPHA, abs=2e-4)


def test_lan_demets_boundaries_differ_slightly_from_the_classic_ones():
    # Pocock-type spending at 5 equal looks: falling slightly around Pocock's flat 2.413.
    pocock = spending_boundaries(tuple(k / 5 for k in range(1, 6)), ALPHA, "pocock")
    assert pocock[0] > 2.413 > pocock[-1] and all(abs(b - 2.413) < 0.03 for b in pocock)
    # O'Brien–Fleming-type: the first look's boundary is 1.96/√0.2 = 4.383 (exactly the spent tail),
    # below the classic 2.040·√5 = 4.562; the last close to 2.040.
    obf = spending_boundaries(tuple(k / 5 for k in range(1, 6)), ALPHA, "obrien_fleming")
    assert obf[0] == pytest.approx(1.959964 / math.sqrt(0.2), abs=1e-5) and abs(obf[-1] - 2.040) < 0.03


@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock"])
def test_boundaries_spend_alpha_look_by_look_in_a_monte_carlo(spending):
    # 400,000 Brownian paths observed at 6 looks (a fixed seed): the share that crossed by look j
    # is α(t_j) within 4 standard errors. The first looks of O'Brien–Fleming spend ~1e-6 (under one
    # path in 400,000): there the count is only checked to be small (the first look's boundary
    # is the closed form Φ⁻¹(1 − α(t_1)/2), tested above).
    t = np.array([2, 4, 6, 8, 10, 12]) / 12
    z = np.array(spending_boundaries(tuple(t), ALPHA, spending))
    rng = np.random.default_rng(11)
    paths = 400_000
    score = np.cumsum(rng.standard_normal((paths, len(t))) * np.sqrt(np.diff(np.concatenate([[0], t]))), axis=1)
    crossed = np.cumsum(np.abs(score / np.sqrt(t)) >= z, axis=1) > 0
    spend = spending_function(spending, ALPHA)
    for j in range(len(t)):
        expected = spend(t[j])
        if expected * paths < 100:
            assert crossed[:, j].sum() <= expected * paths + 10
        else:
            assert abs(crossed[:, j].mean() - expected) <= 4 * math.sqrt(expected * (1 - expected) / paths)


def test_t_boundaries_spend_alpha_of_the_t_process_look_by_look():
    # An independent simulation (another seed) of t statistics at looks 2..12 of one seed per round.
    looks = tuple(range(2, 13))
    c = np.array(t_spending_boundaries(looks, 12, ALPHA, "pocock"))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((200_000, 12))
    statistic = np.stack([x[:, :n].mean(1) / (x[:, :n].std(1, ddof=1) / math.sqrt(n)) for n in looks], axis=1)
    crossed = np.cumsum(np.abs(statistic) >= c, axis=1) > 0
    spend = spending_function("pocock", ALPHA)
    for j, n in enumerate(looks):
        expected = spend(n / 12)
        assert abs(crossed[:, j].mean() - expected) <= 4 * math.sqrt(expected / 200_000) + 1e-6
    # The first look is exact: T_2 is Student t with 1 degree of freedom.
    assert c[0] == pytest.approx(scipy_stats.t.isf(spend(2 / 12) / 2, 1), rel=1e-12)


# ---- the plan -----------------------------------------------------------------------------


def test_looks_rounds_and_the_skipped_one_seed_look():
    assert SequentialPlan(max_seeds=12).looks() == list(range(2, 13))  # the one-seed look is skipped
    assert SequentialPlan(max_seeds=12, seeds_per_round=5).looks() == [5, 10, 12]  # the last round is shorter
    assert SequentialPlan(max_seeds=12, seeds_per_round=2, min_seeds=4).looks() == [4, 6, 8, 10, 12]


@pytest.mark.parametrize("t_boundaries", ["simulated", "nominal_level"])
def test_one_look_is_the_fixed_sample_t_interval(t_boundaries):
    # K = 1 (one round of all 6 seeds): α(1) = 0.05 at one look, so the critical value is the
    # fixed-sample t_{5, 0.975} = 2.570582.
    plan = SequentialPlan(max_seeds=6, seeds_per_round=6, t_boundaries=t_boundaries)
    assert plan.looks() == [6]
    assert plan.boundary(6) == pytest.approx(2.570582, abs=1e-6)


def test_bonferroni_splits_alpha_over_the_comparisons():
    plan = SequentialPlan(max_seeds=6, seeds_per_round=6, comparisons=2)
    assert plan.boundary(6) == pytest.approx(scipy_stats.t.isf(0.025 / 2, 5), rel=1e-12)  # α/2 per comparison


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("max_seeds", 1, "≥ min_seeds"),
        ("min_seeds", 1, "≥ 2"),
        ("seeds_per_round", 0, "≥ 1"),
        ("alpha", 1.5, "in (0, 1)"),
        ("spending", "haybittle", "obrien_fleming, pocock"),
        ("comparisons", 0, "≥ 1"),
        ("t_boundaries", "exact", "simulated, nominal_level"),
    ],
)
def test_a_bad_plan_is_refused_naming_the_field(field, value, allowed):
    with pytest.raises(SequentialPlanError, match=rf"SequentialPlan\.{field} = .*{re.escape(allowed)}"):
        SequentialPlan(**({"max_seeds": 12} | {field: value}))


def test_a_seed_count_that_is_no_look_is_refused():
    with pytest.raises(SequentialPlanError, match=r"5 seeds is not a look of this plan \(looks at 2, 4, 6"):
        decide([0.1, 0.2, 0.3, 0.1, 0.2], SequentialPlan(max_seeds=6, seeds_per_round=2), sesoi=0.1)
    with pytest.raises(SequentialPlanError, match="finite"):
        decide([0.1, float("nan")], SequentialPlan(max_seeds=6), sesoi=0.1)
    with pytest.raises(SequentialPlanError, match="sesoi"):
        decide([0.1, 0.2], SequentialPlan(max_seeds=6), sesoi=0.0)


# ---- decisions ----------------------------------------------------------------------------


def test_the_repeated_interval_by_hand_and_its_sentence():
    # One look at 3 seeds: differences 2, 3, 4; mean 3, s = 1, c = t_{2, 0.975} = 4.302653,
    # half width 4.302653 / √3 = 2.484138: [0.515862, 5.484138] (test_stats' paired interval).
    plan = SequentialPlan(max_seeds=3, seeds_per_round=3)
    d = decide([2.0, 3.0, 4.0], plan, sesoi=1.0)
    assert (d.n, d.mean, d.verdict, d.final) == (3, 3.0, "different", True)
    assert (d.low, d.high, d.critical) == pytest.approx((0.515862, 5.484138, 4.302653), abs=1e-6)
    assert d.describe("eval/x/accuracy", "grpo", "dr_grpo") == (
        "eval/x/accuracy: grpo is better than dr_grpo (grpo − dr_grpo = 3, 95% repeated CI [0.516, 5.48] excludes 0) at 3 of 3 seeds."
    )
    # Lower is better (a length): the same difference makes dr_grpo the better arm.
    assert "dr_grpo is better than grpo" in d.describe("length", "grpo", "dr_grpo", higher_is_better=False)
    # Different and inside ±10: a difference smaller than the smallest effect of interest, said so.
    small = decide([2.0, 3.0, 4.0], plan, sesoi=10.0)
    assert small.verdict == "different" and "smaller than the smallest effect of interest ±10" in small.describe("m", "a", "b")


def test_equivalent_and_undecided_sentences():
    plan = SequentialPlan(max_seeds=3, seeds_per_round=3)
    # mean 0, s = 1: [−2.484, 2.484] lies inside ±3, contains 0.
    same = decide([-1.0, 0.0, 1.0], plan, sesoi=3.0)
    assert same.verdict == "equivalent"
    assert same.describe("m", "a", "b").startswith(
        "m: a and b are equivalent within ±3 (a − b = 0, 95% repeated CI [-2.48, 2.48]"
    )
    unsure = decide([-1.0, 0.0, 1.0], plan, sesoi=2.0)
    assert unsure.verdict == "undecided" and unsure.final
    assert "undecided at the budget of 3 seeds" in unsure.describe("m", "a", "b")
    early = decide([-1.0, 0.0, 1.0], SequentialPlan(max_seeds=6), sesoi=2.0)
    assert not early.final and "undecided at 3 of 6 seeds; add seeds" in early.describe("m", "a", "b")
    assert "98.3% repeated CI" in decide(
        [2.0, 3.0, 4.0], SequentialPlan(max_seeds=3, seeds_per_round=3, comparisons=3), 1.0
    ).describe("m", "a", "b")


def test_seeds_with_no_spread_decide_nothing():
    # Two seeds each 0.015 better (a discrete accuracy: 0.3 − 0.285 and 0.5 − 0.485, equal up to
    # float rounding): a zero-width interval would call it "different" at 2 seeds.
    d = decide([0.3 - 0.285, 0.5 - 0.485], SequentialPlan(max_seeds=6), sesoi=0.1)
    assert d.verdict == "undecided" and math.isnan(d.low) and math.isnan(d.high)
    assert "no spread between seeds" in d.describe("acc", "a", "b")


def test_history_stops_at_the_first_decided_look():
    plan = SequentialPlan(max_seeds=6, seeds_per_round=2, spending="pocock")
    # Looks at 2, 4, 6. At 2 seeds (1.0, 1.1) c is about 28 (1 degree of freedom at the spent
    # 0.0227): half width 28 × 0.0707 / √2 ≈ 1.4, undecided; at 4 (1.0, 1.1, 1.2, 0.9: mean 1.05,
    # s 0.129, c about 5: half width ≈ 0.3) the interval excludes 0; seeds 5–6 are not read.
    differences = [1.0, 1.1, 1.2, 0.9, -3.0, -3.0]
    looks = history(differences, plan, sesoi=0.2)
    assert [d.n for d in looks] == [2, 4] and [d.verdict for d in looks] == ["undecided", "different"]
    assert history([0.1], plan, sesoi=0.2) == []  # before the first look
    assert [d.n for d in history([0.1, 0.5, -0.3], plan, sesoi=0.2)] == [2]  # 3 seeds: the look at 2 only


def test_the_vectorised_rule_agrees_with_decide():
    rng = np.random.default_rng(3)
    plan = SequentialPlan(max_seeds=8, seeds_per_round=2)
    samples = rng.normal(0.15, 0.2, size=(300, 8))
    samples[:5, :2] = 0.25  # ties at the first look
    outcome = sequential_outcomes(samples, plan, sesoi=0.1)
    for row, verdict, seeds in zip(samples, outcome.verdict, outcome.seeds):
        last = history(row, plan, sesoi=0.1)[-1]
        assert (["undecided", "different", "equivalent"][verdict], int(seeds)) == (last.verdict, last.n)


# ---- THE SIMULATION: error rates under optional stopping -------------------------------------

EXPERIMENTS = 20_000


def _accuracy(rng, a: float, b: float, shape) -> np.ndarray:
    """Held-out accuracy on 200 questions of seeds whose true accuracy is drawn from Beta(a, b)."""
    return rng.binomial(200, rng.beta(a, b, size=shape)) / 200


@pytest.mark.parametrize("seeds_per_round", [1, 2])
@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock"])
def test_false_different_and_false_equivalent_stay_within_alpha(spending, seeds_per_round):
    plan = SequentialPlan(max_seeds=12, seeds_per_round=seeds_per_round, spending=spending)
    rng = np.random.default_rng(2024)
    sd, sesoi = 0.2, 0.2
    # No difference, normal per-seed differences (sd 0.2): "different" is an error.
    null = sequential_outcomes(rng.normal(0.0, sd, (EXPERIMENTS, 12)), plan, sesoi)
    assert _within(null.share("different"), ALPHA, EXPERIMENTS), null.share("different")
    # A true difference of exactly δ: "equivalent" is an error (at most α/2: one side of the interval).
    at_sesoi = sequential_outcomes(rng.normal(sesoi, sd, (EXPERIMENTS, 12)), plan, sesoi)
    assert _within(at_sesoi.share("equivalent"), ALPHA / 2, EXPERIMENTS), at_sesoi.share("equivalent")
    # Bounded, discrete, seed-spread accuracies: arm a's seeds spread wider (Beta(8, 12), sd 0.107)
    # than arm b's (Beta(20, 30), sd 0.069), same mean 0.4, each seed scored on 200 questions.
    accuracy = _accuracy(rng, 8, 12, (EXPERIMENTS, 12)) - _accuracy(rng, 20, 30, (EXPERIMENTS, 12))
    bounded = sequential_outcomes(accuracy, plan, sesoi=0.05)
    assert _within(bounded.share("different"), ALPHA, EXPERIMENTS), bounded.share("different")
    # A difference of exactly δ = 0.05 in accuracy (arm a's mean 0.45 = Beta(9, 11)).
    shifted = _accuracy(rng, 9, 11, (EXPERIMENTS, 12)) - _accuracy(rng, 20, 30, (EXPERIMENTS, 12))
    assert _within(sequential_outcomes(shifted, plan, sesoi=0.05).share("equivalent"), ALPHA / 2, EXPERIMENTS)


def test_bonferroni_keeps_each_of_three_comparisons_at_a_third():
    plan = SequentialPlan(max_seeds=12, comparisons=3)
    null = sequential_outcomes(np.random.default_rng(8).normal(0.0, 1.0, (EXPERIMENTS, 12)), plan, sesoi=1.0)
    assert _within(null.share("different"), ALPHA / 3, EXPERIMENTS)


def test_the_nominal_level_conversion_overspends_which_is_why_it_is_not_the_default():
    # Pocock-type, one seed per round, 12 seeds: the significance-level conversion to t spends
    # about 0.06 (measured 0.061 over 200,000 experiments), the simulated t boundaries 0.05.
    samples = np.random.default_rng(9).normal(0.0, 1.0, (40_000, 12))
    nominal = sequential_outcomes(samples, SequentialPlan(max_seeds=12, spending="pocock", t_boundaries="nominal_level"), 1e-9)
    simulated = sequential_outcomes(samples, SequentialPlan(max_seeds=12, spending="pocock"), 1e-9)
    assert not _within(nominal.share("different"), ALPHA, 40_000), nominal.share("different")
    assert _within(simulated.share("different"), ALPHA, 40_000), simulated.share("different")
    looks = tuple(range(2, 13))
    assert nominal_t_boundaries(looks, 12, ALPHA, "pocock")[0] == pytest.approx(
        t_spending_boundaries(looks, 12, ALPHA, "pocock")[0]
    )
