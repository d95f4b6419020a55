"""``polyrl calibrate``: the A/A false-positive rate of compare's verdicts on an arm's own seed runs.

The seed runs of one arm are split into two sides (an A/A pair under two seed streams) and
compared as ``compare`` would at ``--per-side`` seeds; see :mod:`polyrl.analysis.calibration`.
"""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console

from polyrl.cli.errors import user_errors

console = Console()


def calibrate_command(
    experiment: str = typer.Argument(..., help="An experiment run with seeds (the newest run of that name)."),
    arm: str = typer.Option(..., "--arm", help="The arm whose seed runs make the A/A pairs."),
    per_side: int = typer.Option(3, "--per-side", help="Seeds on each side of an A/A pair: the seed count calibrated."),
    metric: Optional[list[str]] = typer.Option(
        None, "--metric", help="A metric to calibrate (repeatable; default: the eval headline metrics the runs logged)."
    ),
    sesoi: float = typer.Option(
        1.0, "--sesoi", help="The sequential rule's smallest effect of interest (only decides 'equivalent')."
    ),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="MLflow tracking URI (default: ./mlflow.db)."),
) -> None:
    """How often two halves of one arm's seed runs are called different (every such call is false)."""
    from polyrl.analysis.calibration import aa_calibration, arm_seed_finals
    from polyrl.tracking.mlflow_runs import resolve_tracking_uri

    with user_errors():
        finals = arm_seed_finals(experiment, tracking_uri=resolve_tracking_uri(tracking_uri), arm=arm, metrics=metric or None)
        results = [aa_calibration(values, name, per_side, sesoi=sesoi) for name, values in finals.items()]
    for result in results:
        console.print(result.describe(), highlight=False)
