"""``polyrl objectives``: inspect the registered objectives and advantage estimators."""

from __future__ import annotations

import re

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
    """Print every registered objective: name, paper (arXiv id), defaults, one-line description."""
    console = Console()
    # A list to scan: the name, where it comes from and what it does. Params, deviations and the
    # paper's full title are one `show NAME` away; six wrapped columns were unreadable at 80
    # columns once the registry grew past a handful of names.
    if advantages:
        table = Table("name", "paper", "requires", "description", title="Advantage estimators")
        for spec in list_advantages():
            table.add_row(*map(escape, (spec.name, _arxiv(spec.paper), ", ".join(spec.requires) or "-", spec.description)))
    else:
        table = Table("name", "paper", "defaults", "description", title="Objectives")
        for spec in list_objectives():
            defaults = f"{spec.default_advantage}, {spec.default_aggregation}"
            # Descriptions hold brackets like sg[s_i] that rich would read as markup.
            table.add_row(*map(escape, (spec.name, _arxiv(spec.paper), defaults, spec.description)))
    for column in table.columns[:2]:
        column.no_wrap = True
    console.print(table)
    console.print("Details of one (params, deviations, the paper): polyrl objectives show NAME [--advantage]")


def _arxiv(paper: str) -> str:
    """``arXiv 2503.20783`` from a citation, or the citation's start when it has no arXiv id."""
    found = re.search(r"arXiv[: ]*(\d{4}\.\d{4,5})", paper)
    return f"arXiv {found.group(1)}" if found else (paper.split(",")[0][:24] or "-")


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
