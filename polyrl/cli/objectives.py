"""``polyrl objectives``: inspect the registered objectives and advantage estimators."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from polyrl.algos.advantages import get_advantage, list_advantages
from polyrl.algos.objectives import get_objective, list_objectives
from polyrl.algos.params import Params, describe_param
from polyrl.cli.errors import fail

app = typer.Typer(help="Policy objectives and advantage estimators registered in polyrl.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Policy objectives and advantage estimators registered in polyrl."""
    # A callback keeps `list` a sub-command even while it is the only command.


@app.command("list")
def list_command(
    advantages: bool = typer.Option(False, "--advantages", help="List advantage estimators instead."),
) -> None:
    """Print every registered objective: name, one-line description, params, paper."""
    console = Console()
    if advantages:
        table = Table("name", "description", "requires", "params", "paper", title="Advantage estimators")
        for spec in list_advantages():
            cells = (spec.name, spec.description, ", ".join(spec.requires), ", ".join(spec.params.model_fields), spec.paper)
            table.add_row(*map(escape, cells))
    else:
        table = Table("name", "description", "aggregation", "advantage", "params", "paper", title="Objectives")
        for spec in list_objectives():
            cells = (spec.name, spec.description, spec.default_aggregation, spec.default_advantage,
                     ", ".join(spec.params.model_fields), spec.paper)  # fmt: skip
            # Descriptions hold brackets like sg[s_i] that rich would read as markup.
            table.add_row(*map(escape, cells))
    for column in table.columns[:1]:
        column.no_wrap = True
    console.print(table)
    console.print("Details of one: polyrl objectives show NAME [--advantage]")


@app.command("show")
def show_command(
    name: str = typer.Argument(..., help="A registered objective (or, with --advantage, estimator)."),
    advantage: bool = typer.Option(False, "--advantage", help="Show an advantage estimator."),
) -> None:
    """Print one objective's (or estimator's) params: type and range, default, meaning."""
    try:
        spec = get_advantage(name) if advantage else get_objective(name)
    except ValueError as error:
        fail(str(error))
    console = Console()
    console.print(f"[bold]{escape(spec.name)}[/bold]: {escape(spec.description)}\n{escape(spec.paper)}")
    if getattr(spec, "deviations", ""):
        console.print(f"deviations: {escape(spec.deviations)}")
    table = Table("param", "allowed", "default", "meaning", title=f"{'advantage' if advantage else 'objective'}.params")
    _add_param_rows(table, spec.params)
    console.print(table)
    if not advantage:
        console.print("kl_coef, kl_estimator and entropy_coef are set in train.*, not here.")


def _add_param_rows(table: Table, model: type[Params]) -> None:
    for param, field in model.model_fields.items():
        default = (
            "null"
            if field.default is None
            else str(field.default).lower()
            if isinstance(field.default, bool)
            else str(field.default)
        )
        table.add_row(*map(escape, (param, describe_param(model, param), default, field.description or "")))
