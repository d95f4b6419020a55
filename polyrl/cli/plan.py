"""``polyrl plan``: how many seeds a comparison needs, and the wall time that asks for.

From the standard deviation of the per-seed paired differences (``--sd``, or read from a
finished experiment run with seeds: a pilot) and the effect worth detecting, it prints the
seeds of a fixed design, the budget and expected seeds of a sequential plan with the same
power (:mod:`polyrl.analysis.planning`), and seeds × arms × minutes per run.
"""

from __future__ import annotations

import math
from typing import Optional

import typer
from rich.console import Console
from scipy import stats as scipy_stats

from polyrl.cli.errors import user_errors
from polyrl.core.errors import PolyrlError

console = Console()
PILOT_BOUND = 0.8  # the one-sided confidence of the pilot's sd upper bound that is printed


class PlanOptionError(PolyrlError, ValueError):
    pass


def _hours(minutes: float) -> str:
    return f"{minutes / 60:.1f} h" if minutes >= 90 else f"{minutes:.0f} min"


def sd_upper_bound(sd: float, n: int, confidence: float = PILOT_BOUND) -> float:
    """The one-sided upper confidence bound of a normal standard deviation from ``n`` values:
    ``s · √((n − 1) / χ²_{n−1}(1 − confidence))``."""
    return sd * math.sqrt((n - 1) / scipy_stats.chi2.ppf(1 - confidence, n - 1))


def plan_command(
    experiment: Optional[str] = typer.Argument(
        None, help="A finished experiment run with seeds (a pilot): the sd is read from its per-seed paired differences."
    ),
    sd: Optional[float] = typer.Option(None, "--sd", help="Standard deviation of the per-seed paired differences (a − b)."),
    effect: float = typer.Option(..., "--effect", help="The difference worth detecting, in the metric's units."),
    minutes_per_run: Optional[float] = typer.Option(
        None, "--minutes-per-run", help="Minutes one seed run of one arm takes (default with an experiment: its runs' mean)."
    ),
    arms: Optional[int] = typer.Option(None, "--arms", help="Arms in the experiment planned (default 2, or the pilot's)."),
    comparisons: Optional[int] = typer.Option(
        None, "--comparisons", help="Comparisons sharing alpha (Bonferroni); default: every pair of arms."
    ),
    alpha: float = typer.Option(0.05, "--alpha", help="Error rate over all looks and comparisons."),
    power: float = typer.Option(0.8, "--power", help="Chance of declaring the effect when it is there."),
    seeds_per_round: int = typer.Option(1, "--seeds-per-round", help="Seeds added to every arm per round."),
    spending: str = typer.Option("obrien_fleming", "--spending", help="obrien_fleming or pocock (Lan–DeMets spending)."),
    sesoi: Optional[float] = typer.Option(
        None, "--sesoi", help="Smallest effect of interest for equivalence (default: --effect)."
    ),
    metric: Optional[str] = typer.Option(None, "--metric", help="With an experiment: the metric compared."),
    arm_a: Optional[str] = typer.Option(None, "--arm-a", help="With an experiment: arm a of a − b (default: its two arms)."),
    arm_b: Optional[str] = typer.Option(None, "--arm-b", help="With an experiment: arm b of a − b."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="Default: $MLFLOW_TRACKING_URI, else ./mlflow.db."),
) -> None:
    """Seeds needed to settle a comparison (fixed design and sequential plan) and the wall time."""
    from polyrl.analysis.planning import fixed_seeds, plan_seeds, wall_minutes
    from polyrl.analysis.sequential import SequentialPlanError

    with user_errors():
        if sd is None and experiment is None:
            raise PlanOptionError("give --sd, or an EXPERIMENT (a pilot run with seeds) to read the sd from")
        if sd is not None and experiment is not None:
            raise PlanOptionError("give --sd or an EXPERIMENT to read the sd from, not both")
        if experiment is not None:
            if not metric:
                raise PlanOptionError("--metric: with an experiment, name the metric compared (e.g. eval/<suite>/accuracy)")
            from polyrl.analysis.pilot import pilot_differences
            from polyrl.tracking.mlflow_runs import resolve_tracking_uri

            pilot = pilot_differences(
                experiment, tracking_uri=resolve_tracking_uri(tracking_uri), metric=metric, arm_a=arm_a, arm_b=arm_b
            )
            sd = pilot.sd
            if not sd > 0:
                raise PlanOptionError(
                    f"{metric}: every seed's {pilot.arm_a} − {pilot.arm_b} is {pilot.differences[0]:.4g}: no spread to plan from"
                )
            arms = arms or len(pilot.arms)
            minutes_per_run = minutes_per_run or pilot.minutes_per_run
            n = len(pilot.differences)
            console.print(
                f"pilot: {experiment}, {metric}, {pilot.arm_a} − {pilot.arm_b} at seeds {', '.join(map(str, pilot.seeds))}: "
                f"{', '.join(f'{d:.4g}' for d in pilot.differences)}; sd {sd:.4g}",
                highlight=False,
                soft_wrap=True,
            )
            bound = sd_upper_bound(sd, n)
            console.print(
                f"  ({n} seeds measure the sd loosely: its {PILOT_BOUND:.0%} upper bound is {bound:.4g}, where a fixed design "
                f"would need {fixed_seeds(bound, effect, alpha=alpha, power=power, comparisons=comparisons or 1)} seeds)",
                highlight=False,
                soft_wrap=True,
            )
        elif arm_a or arm_b or metric:
            raise PlanOptionError("--metric, --arm-a and --arm-b read a pilot experiment: give its name, or drop them")
        arms = arms or 2
        if arms < 2:
            raise PlanOptionError(f"--arms {arms}: a comparison needs at least 2 arms")
        comparisons = arms * (arms - 1) // 2 if comparisons is None else comparisons
        try:
            found = plan_seeds(
                sd, effect, alpha, power, seeds_per_round=seeds_per_round, spending=spending, comparisons=comparisons, sesoi=sesoi
            )
        except SequentialPlanError as error:  # name the option, not the dataclass field
            message = str(error)
            for field in ("seeds_per_round", "spending", "alpha", "comparisons"):
                message = message.replace(f"SequentialPlan.{field}", "--" + field.replace("_", "-"))
            raise PlanOptionError(message) from None
    kind = {"obrien_fleming": "O'Brien–Fleming-type", "pocock": "Pocock-type"}[spending]
    console.print(
        f"effect {effect:g} at sd {sd:.4g} (effect/sd {effect / sd:.2f}); alpha {alpha:g} over {comparisons} "
        f"comparison{'s' if comparisons > 1 else ''} (Bonferroni), power {power:.0%}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"fixed design: {found.fixed} seeds per arm (paired t test, exact power)", highlight=False, soft_wrap=True)
    null = found.at_no_difference
    console.print(
        f"sequential plan ({kind} spending, rounds of {seeds_per_round}): budget max_seeds {found.max} "
        f"(power {found.power:.1%}, simulated); expected seeds {found.expected:.1f} at the effect, "
        f"{null.expected_seeds:.1f} with no difference (declared equivalent within ±{found.sesoi:g} in {null.equivalent:.0%} "
        f"of those, undecided at budget in {null.undecided:.0%})",
        highlight=False,
        soft_wrap=True,
    )
    if minutes_per_run:
        with user_errors():
            times = {
                "fixed": wall_minutes(found.fixed, arms, minutes_per_run),
                "expected": wall_minutes(found.expected, arms, minutes_per_run),
                "budget": wall_minutes(found.max, arms, minutes_per_run),
            }
        console.print(
            f"wall time ({arms} arms × {minutes_per_run:.3g} min per run, one after another): fixed design "
            f"{_hours(times['fixed'])}; sequential expected {_hours(times['expected'])}, at most {_hours(times['budget'])}",
            highlight=False,
            soft_wrap=True,
        )
    else:
        console.print("(--minutes-per-run gives the wall time)", highlight=False, soft_wrap=True)
