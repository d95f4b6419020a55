"""Calling an environment's own code (``start``, ``step``) as reward modules are called.

Each call runs on a time budget (``env.step_timeout_s``; :func:`polyrl.core.user_code.call_with_time_budget`):
a ``step`` that never returns would otherwise hang the run. An exception, a ``sys.exit`` (which
would end the run with its exit status, 0 for ``sys.exit()``, having trained nothing) or a
time-out becomes one :class:`~polyrl.envs.base.EnvFailedError` naming the environment, the
method, the row and the turn, and the file and line that raised, instead of a long traceback.
After a time-out the stuck call cannot be stopped (Python cannot kill a thread): the run stops
there, as it does for a reward module.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, TypeVar

from polyrl.core.errors import PolyrlError
from polyrl.core.user_code import TimeBudgetError, call_with_time_budget, error_reason, where_it_failed
from polyrl.envs.base import EnvFailedError

__all__ = ["DEFAULT_STEP_TIMEOUT_S", "EnvStuckError", "call_env", "env_source", "row_words", "snippet"]

# An environment call's budget when none is set (env.step_timeout_s, polyrl envs check --timeout):
# generous, for a step that runs several tools of env.tool_timeout_s each.
DEFAULT_STEP_TIMEOUT_S = 60.0
SNIPPET_CHARS = 60

T = TypeVar("T")


class EnvStuckError(EnvFailedError):
    """An environment call ran past its time budget: it may still be running, so nothing may go on beside it."""


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    """The start of ``text`` on one line, quoted, with an ellipsis when cut."""
    flat = " ".join(str(text).split())
    return repr(flat if len(flat) <= limit else flat[:limit] + "…")


def row_words(prompt: str, fields: dict[str, Any], index: int) -> str:
    """A data row for messages: its ``id`` column when it has one, else its place in the batch, and its prompt."""
    if "id" in fields:
        return f"row id {fields['id']!r} (prompt {snippet(prompt)})"
    return f"row {index} of the batch (prompt {snippet(prompt)})"


def env_source(env: Any) -> str | None:
    """The file of the environment's class, so a failure is reported at the author's line."""
    try:
        return inspect.getsourcefile(type(env))
    except TypeError:
        return None


def call_env(
    function: Callable[..., T],
    *args: Any,
    env_name: str,
    method: str,
    where: str,
    timeout_s: float | None,
    source: str | None = None,
    budget_field: str = "env.step_timeout_s",
) -> T:
    """``function(*args)`` (the environment's ``method``) within ``timeout_s`` seconds, or
    :class:`EnvFailedError` saying which environment, method and ``where`` (row, turn) failed, how
    and at which line. ``budget_field`` is the setting a slow (not stuck) environment raises."""
    try:
        return call_with_time_budget(function, *args, timeout_s=timeout_s, what=f"environment {env_name!r}: {method}")
    except TimeBudgetError as error:
        raise EnvStuckError(f"{error}; it was playing {where}. If it is slow rather than stuck, raise {budget_field}") from None
    except SystemExit as error:  # would end the run with its exit status (0 for sys.exit()) and no message
        raise EnvFailedError(
            f"environment {env_name!r} called sys.exit({error.code!r}) in {method} on {where} "
            f"({where_it_failed(error, source)}); an environment must return, not exit"
        ) from None
    except PolyrlError as error:
        if isinstance(error, EnvFailedError):
            raise
        raise EnvFailedError(f"environment {env_name!r} failed in {method} on {where}: {error}") from error
    except Exception as error:  # noqa: BLE001 - the author's bug, reported with its line
        raise EnvFailedError(
            f"environment {env_name!r} raised {error_reason(error)} in {method} on {where} ({where_it_failed(error, source)})"
        ) from error
