"""What the plug-in authoring commands (``polyrl rewards ...``, ``polyrl envs ...``) share.

Each command keeps its own wording and templates; the logic that is the same for every kind of
plug-in lives here: the scaffold ``new`` writes, the constructor parameters ``list`` shows, the
JSONL rows ``check`` reads and the table of check results it prints.
"""

from __future__ import annotations

import inspect
import json
import keyword
import re
from pathlib import Path
from typing import Annotated, Any, Iterable, Iterator, Optional, Protocol

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from polyrl.cli.errors import fail
from polyrl.core.errors import PolyrlError

__all__ = [
    "Force",
    "Limit",
    "PluginRef",
    "ScaffoldDir",
    "check_table",
    "console",
    "describe_params",
    "jsonl_objects",
    "summary_line",
    "write_scaffold",
]

# The arguments and options that mean the same in every kind's commands.
PluginRef = Annotated[str, typer.Argument(help="registered name, package.module:Class or path/to/file.py:Class")]
ScaffoldDir = Annotated[Path, typer.Option("--dir", help="where to write NAME.py and test_NAME.py")]
Force = Annotated[bool, typer.Option("--force", help="overwrite existing files")]
Limit = Annotated[Optional[int], typer.Option("--limit", help="use only the first N rows")]


class CheckResult(Protocol):
    name: str
    status: str
    message: str


def console() -> Console:
    return Console(width=160, soft_wrap=True)


def describe_params(cls: type) -> list[str]:
    """``name: type = default`` for each constructor parameter (from the signature)."""
    try:
        signature = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return []
    out = []
    for name, param in signature.parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL,):
            continue
        if param.kind == param.VAR_KEYWORD:
            out.append(f"**{name}")
            continue
        text = name
        if param.annotation is not inspect.Parameter.empty:
            annotation = (
                param.annotation
                if isinstance(param.annotation, str)
                else getattr(param.annotation, "__name__", str(param.annotation))
            )
            text += f": {annotation}"
        if param.default is not inspect.Parameter.empty:
            text += f" = {param.default!r}"
        out.append(text)
    return out


def summary_line(cls: type) -> str:
    """The first line of the class docstring ("" without one)."""
    doc = (inspect.getdoc(cls) or "").strip()
    return doc.splitlines()[0] if doc else ""


def _class_name(name: str, fallback: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or fallback


def write_scaffold(
    name: str,
    directory: Path,
    *,
    force: bool,
    module_template: str,
    test_template: str,
    example_name: str,
    fallback_class: str,
) -> tuple[Path, Path, str]:
    """Write ``NAME.py`` and ``test_NAME.py`` from the templates; (module path, test path, class name).

    Echoes what it wrote and the pytest line; the caller adds its own next steps.
    """
    # The name becomes file names inside --dir: an identifier has no '/' or '..', so it cannot escape.
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or keyword.iskeyword(name):
        fail(f"{name!r} is not a snake_case Python identifier (e.g. {example_name})")
    module_path, test_path = directory / f"{name}.py", directory / f"test_{name}.py"
    existing = [str(p) for p in (module_path, test_path) if p.exists()]
    if existing and not force:
        fail(f"{', '.join(existing)} already exist(s); use --force to overwrite")
    directory.mkdir(parents=True, exist_ok=True)
    class_name = _class_name(name, fallback_class)
    module_path.write_text(module_template.format(name=name, class_name=class_name))
    test_path.write_text(test_template.format(name=name, class_name=class_name))
    typer.echo(f"wrote {module_path} and {test_path}")
    typer.echo(f"next: pytest {test_path}")
    return module_path, test_path, class_name


def jsonl_objects(path: Path, error: type[PolyrlError]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of ``path``; a line that is not a JSON object raises ``error``."""
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as failure:
                raise error(f"{path}:{line_number}: not valid JSON: {failure}") from failure
            if not isinstance(row, dict):
                raise error(f"{path}:{line_number}: expected a JSON object per line")
            yield line_number, row


def print_failures(console: Any, results: Iterable[CheckResult], *, failed: str, warned: str | None = None) -> None:
    """Each failed (and warned) check's whole message on one line after the table: in the table's
    narrow detail column a long message (a file path, a traceback's last line) is folded over many
    rows, hard to read and impossible to search for."""
    for result in results:
        if result.status in (failed, warned):
            prefix = "FAILED" if result.status == failed else "WARNING"
            console.print(f"{prefix} {result.name}: {result.message}", markup=False, highlight=False, soft_wrap=True)


def check_table(title: str, results: Iterable[CheckResult], *, passed: str, failed: str) -> Table:
    """One row per check: name, status (green when ``passed``, red when ``failed``, else yellow), detail."""
    table = Table(title=title)
    for column in ("check", "status", "detail"):
        table.add_column(column, overflow="fold")
    colours = {passed: "green", failed: "red"}
    for result in results:
        colour = colours.get(result.status, "yellow")
        table.add_row(result.name, f"[{colour}]{result.status}[/{colour}]", escape(result.message))
    return table
