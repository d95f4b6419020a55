"""Operating characteristics of the sequential stopping rule (polyrl/analysis/sequential.py),
by simulation: the tables of docs/verdicts.md, "The stopping rule".

For seed budgets of 6, 12 and 20 seeds per arm (one seed per round) and true effects of 0.5,
1 and 1.5 standard deviations of the per-seed paired difference, with the smallest effect of
interest equal to the effect: the share of experiments declared "different" when there is no
difference (the error rate) and "equivalent" then, the power at the effect, the fixed design's
power at the budget (exact), and the expected seeds used. A second table: the false
"different" rate of the two ways of turning the normal boundaries into t critical values, on
normal and on bounded, discrete accuracy differences (without equivalence stopping).

    python experiments/analysis/sequential_power.py [--experiments 20000]

About a minute on one core.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy import stats as scipy_stats

from polyrl.analysis.planning import fixed_power, simulate_plan
from polyrl.analysis.sequential import SequentialPlan, sequential_outcomes

BUDGETS = (6, 12, 20)
EFFECTS = (0.5, 1.0, 1.5)  # in standard deviations of the per-seed paired difference
SPENDINGS = ("obrien_fleming", "pocock")


def operating_table(experiments: int) -> list[str]:
    lines = [
        "| max seeds | spending | effect / sd | P(different), no difference | P(equivalent), no difference "
        "| power at the effect | fixed design's power at max seeds | expected seeds at the effect "
        "| expected seeds, no difference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for max_seeds in BUDGETS:
        for spending in SPENDINGS:
            plan = SequentialPlan(max_seeds=max_seeds, spending=spending)
            for effect in EFFECTS:
                null = simulate_plan(plan, sd=1.0, true_difference=0.0, sesoi=effect, experiments=experiments, seed=1)
                alt = simulate_plan(plan, sd=1.0, true_difference=effect, sesoi=effect, experiments=experiments, seed=2)
                fixed = fixed_power(max_seeds, sd=1.0, effect=effect, alpha=plan.alpha)
                lines.append(
                    f"| {max_seeds} | {spending} | {effect:g} | {null.different:.3f} | {null.equivalent:.3f} "
                    f"| {alt.different:.3f} | {fixed:.3f} | {alt.expected_seeds:.1f} | {null.expected_seeds:.1f} |"
                )
    return lines


def _accuracies(rng: np.random.Generator, a: float, b: float, shape: tuple[int, int]) -> np.ndarray:
    """Held-out accuracy on 200 questions of seeds whose true accuracy is drawn from Beta(a, b)."""
    return rng.binomial(200, rng.beta(a, b, size=shape)) / 200


def error_table(experiments: int) -> list[str]:
    cases = {
        "normal": lambda rng, shape: rng.normal(0.0, 1.0, shape),
        "accuracies, Beta(8,12) − Beta(20,30) (skew 0.1)": lambda rng, shape: (
            _accuracies(rng, 8, 12, shape) - _accuracies(rng, 20, 30, shape)
        ),
        "accuracies, Beta(2,8) − Beta(20,80) (skew 0.7)": lambda rng, shape: (
            _accuracies(rng, 2, 8, shape) - _accuracies(rng, 20, 80, shape)
        ),
        "accuracies, Beta(1,9) − Beta(50,450) (skew 1.3)": lambda rng, shape: (
            _accuracies(rng, 1, 9, shape) - _accuracies(rng, 50, 450, shape)
        ),
    }
    lines = [
        "| per-seed differences | max seeds | spending | nominal_level | simulated (default) | fixed t test at max seeds |",
        "|---|---|---|---|---|---|",
    ]
    for name, draw in cases.items():
        for max_seeds in (6, 12, 20):
            samples = draw(np.random.default_rng(max_seeds), (experiments, max_seeds))
            n = max_seeds
            t = samples.mean(1) / (samples.std(1, ddof=1) / math.sqrt(n))
            fixed = float(np.mean(np.abs(t) > scipy_stats.t.isf(0.025, n - 1)))
            for spending in SPENDINGS:
                shares = []
                for method in ("nominal_level", "simulated"):
                    plan = SequentialPlan(max_seeds=max_seeds, spending=spending, t_boundaries=method)
                    shares.append(sequential_outcomes(samples, plan, sesoi=1e-12).share("different"))
                lines.append(f"| {name} | {max_seeds} | {spending} | {shares[0]:.3f} | {shares[1]:.3f} | {fixed:.3f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, default=20_000, help="simulated experiments per cell")
    args = parser.parse_args()
    start = time.perf_counter()
    se = math.sqrt(0.05 * 0.95 / args.experiments)
    print(f"{args.experiments} simulated experiments per cell (standard error of a 5% share: {se:.4f})\n")
    print("\n".join(operating_table(args.experiments)))
    print()
    print("\n".join(error_table(args.experiments)))
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
