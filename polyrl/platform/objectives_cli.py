"""``polyrl objectives``: inspect the registered objectives and advantage estimators."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from polyrl.platform.advantages import list_advantages
from polyrl.platform.objectives import list_objectives

app = typer.Typer(help="Policy objectives and advantage estimators registered in polyrl.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Policy objectives and advantage estimators registered in polyrl."""
    # A callback keeps `list` a sub-command even while it is the only command.


@app.command("list")
def list_command(
    advantages: bool = typer.Option(False, "--advantages", help="List advantage estimators instead."),
) -> None:
    """Print every registered objective: name, one-line description, paper."""
    console = Console()
    if advantages:
        table = Table("name", "description", "requires", "paper", title="Advantage estimators")
        for spec in list_advantages():
            table.add_row(*map(escape, (spec.name, spec.description, ", ".join(spec.requires), spec.paper)))
    else:
        table = Table("name", "description", "aggregation", "advantage", "paper", title="Objectives")
        for spec in list_objectives():
            cells = (spec.name, spec.description, spec.default_aggregation, spec.default_advantage, spec.paper)
            # Descriptions hold brackets like sg[s_i] that rich would read as markup.
            table.add_row(*map(escape, cells))
    for column in table.columns[:1]:
        column.no_wrap = True
    console.print(table)
