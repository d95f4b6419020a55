"""How every polyrl command reports a user's mistake: one message on stderr, exit 2.

``with user_errors(): ...`` turns any :class:`polyrl.core.errors.PolyrlError` into that message; any
other exception is a bug and keeps its traceback. An error class may set ``exit_code`` (e.g.
a failed arm exits 1, not 2). The three command groups (``polyrl``, ``polyrl eval``,
``polyrl rewards``) share this one helper so they cannot drift apart again.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, NoReturn

import typer
from rich.markup import escape

from polyrl.core.console import error_console
from polyrl.core.errors import PolyrlError

USAGE_ERROR = 2


def fail(message: str, code: int = USAGE_ERROR) -> NoReturn:
    """Print ``error: message`` to stderr and exit with ``code``."""
    error_console.print(f"[bold red]error[/]: {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def user_errors(describe: Callable[[PolyrlError], str] = str) -> Iterator[None]:
    """Report a :class:`PolyrlError` raised in the block as one message (see the module doc)."""
    try:
        yield
    except PolyrlError as error:
        fail(describe(error) or type(error).__name__, getattr(error, "exit_code", USAGE_ERROR))
