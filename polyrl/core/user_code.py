"""Running code a user wrote (reward modules, environments): importing it, and calling it on a time budget.

Importing a user's file can end the process instead of raising: a script's
``sys.exit(main())`` without the ``if __name__ == "__main__":`` guard, or ``os._exit(0)``.
Before this module, ``polyrl run`` and ``polyrl rewards check`` then exited 0 having done
nothing. Two defences, both here so that every kind of plug-in is loaded the same way:

- ``SystemExit`` raised while the file is imported is caught and reported as that file's
  failure, with the line of the call.
- Ways of ending the process that no ``except`` sees (``os._exit``, ``os.kill`` of itself, a
  crash in a C extension) are found by importing the file once first in a child interpreter
  (:func:`probe_import`): the child writes "returned" to a report file only when the import
  returned (or raised: the in-process import then reports the exception with its line). A child
  that ends without that report ended the process while importing; the parent says so and
  does not import the file itself. The probe was chosen over patching ``os._exit`` during the
  import because it catches every way of dying, not only the one function patched, and leaves
  the parent's globals alone. Its cost: one interpreter start plus the file's own imports
  (``from polyrl.rewards import ...`` included), once per file per process; the file's
  top-level code runs twice (a plug-in file should only define things when imported). Modules
  of polyrl itself are not probed.

:func:`call_with_time_budget` runs a user's method in a worker thread and stops waiting after
``timeout_s``: a reward that never returns would otherwise block a run forever. Python cannot
kill a thread, so the stuck call keeps running in a daemon thread while the caller raises
:class:`TimeBudgetError`; the run must stop there (its process exits, and the daemon thread
with it), never go on beside a call that may still write into shared state.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, TypeVar

from polyrl.core.errors import PolyrlError

# How long the child may take to import a file (heavy imports such as torch are slow; a file
# that needs longer than this to import is as good as stuck).
IMPORT_PROBE_TIMEOUT_S = 300.0
GUARD_HINT = 'a plug-in file must only define things when imported: put a script\'s main() under if __name__ == "__main__":'

T = TypeVar("T")

_PROBED: dict[tuple[str, str], str | None] = {}  # (kind, target + stat) -> problem or None

_PROBE = r"""
import importlib, importlib.util, json, os, sys
kind, target, name, report, paths = sys.argv[1:6]
sys.path[:] = json.loads(paths)
def done(outcome):
    with open(report, "w") as handle:
        handle.write(outcome)
    os._exit(0)  # skip exit hooks the imported code may have registered
try:
    if kind == "file":
        spec = importlib.util.spec_from_file_location(name, target)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        importlib.import_module(target)
except BaseException:  # the parent imports it again and reports the exception with its line
    done("raised")
done("returned")
"""


class UserCodeError(PolyrlError, ValueError):
    """A user's file failed to import: it raised, exited or ended the process."""


class TimeBudgetError(PolyrlError, RuntimeError):
    """A user's method did not return within its time budget."""


def where_it_failed(error: BaseException, prefer_file: str | Path | None = None) -> str:
    """``file, line N`` of the user's code that raised ``error``.

    A syntax error names its own place. Otherwise the deepest traceback frame in
    ``prefer_file`` (the user's source file) wins, so a failing ``import numpyy`` or a library
    call that raises is reported at the user's line rather than deep inside a library; failing
    that, the deepest frame that is not import machinery.
    """
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}, line {error.lineno}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<")]
    if prefer_file is not None:
        target = Path(prefer_file).resolve()
        own = [f for f in frames if Path(f.filename).resolve() == target]
        if own:
            return f"{own[-1].filename}, line {own[-1].lineno}"
    if frames:
        return f"{frames[-1].filename}, line {frames[-1].lineno}"
    return str(prefer_file) if prefer_file is not None else "(unknown place)"


def error_reason(error: BaseException, *, importing: bool = False) -> str:
    """``Type: message`` of an exception (a syntax error's own message without its place)."""
    if isinstance(error, SystemExit):
        return f"it called sys.exit({error.code!r})" + (f" while being imported; {GUARD_HINT}" if importing else "")
    text = error.msg if isinstance(error, SyntaxError) else str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def probe_import(kind: str, target: str, module_name: str = "", *, timeout_s: float = IMPORT_PROBE_TIMEOUT_S) -> str | None:
    """Import ``target`` (``kind`` "file": a path; "module": a dotted name) in a child interpreter;
    None when the import returned or raised there, else what ended it (the process exited or was
    killed during the import, or it ran past ``timeout_s``). Cached per file state in this process."""
    try:
        stat = os.stat(target) if kind == "file" else None
    except OSError:
        stat = None
    key = (kind, f"{target}:{stat.st_mtime_ns}:{stat.st_size}" if stat else target)
    if key in _PROBED:
        return _PROBED[key]
    with tempfile.TemporaryDirectory(prefix="polyrl-probe-") as folder:
        report = Path(folder, "outcome")
        command = [sys.executable, "-c", _PROBE, kind, target, module_name or "polyrl_probe", str(report), json.dumps(sys.path)]
        try:
            child = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            problem = f"importing it did not finish within {timeout_s:g} s (does its top-level code wait or loop?)"
        else:
            if report.is_file():
                problem = None
            else:
                said = [line for line in (child.stderr or "").strip().splitlines() if line.strip()]
                last = f"; its last words: {said[-1].strip()[:200]!r}" if said else ""
                problem = (
                    f"importing it ended the process ({_ended(child.returncode)}) before the import returned{last}; {GUARD_HINT}"
                )
    _PROBED[key] = problem
    return problem


def import_user_file(path: str | Path, module_name: str, *, probe: bool = True) -> ModuleType:
    """Import the Python file ``path`` as ``module_name`` (registered in ``sys.modules``).

    Any failure raises :class:`UserCodeError` whose message is ``<file, line N>: <reason>``
    (or ``<file>: <what ended the process>``); the caller prefixes what it was loading.
    """
    path = Path(path).resolve()
    if probe and (problem := probe_import("file", str(path), module_name)) is not None:
        raise UserCodeError(f"{path}: {problem}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"{path}: cannot be loaded as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look classes up here
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - any failure of the user's file is reported with its line
        sys.modules.pop(module_name, None)
        raise UserCodeError(f"{where_it_failed(error, path)}: {error_reason(error, importing=True)}") from error
    return module


def import_user_module(name: str, *, probe: bool = True) -> ModuleType:
    """``importlib.import_module(name)`` with an exit at import reported like a failure.

    A missing module raises ``ModuleNotFoundError`` unchanged (the caller tells "not installed"
    from "fails inside"); any other failure raises :class:`UserCodeError` (see
    :func:`import_user_file`). polyrl's own modules are not probed.
    """
    if probe and name.split(".")[0] != "polyrl" and name not in sys.modules:
        if importlib.util.find_spec(name.split(".")[0]) is not None and (problem := probe_import("module", name)) is not None:
            raise UserCodeError(f"{module_file(name) or name}: {problem}")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if name == missing or name.startswith(missing + "."):  # the module itself is not there
            raise
        raise UserCodeError(f"{where_it_failed(error, module_file(name))}: {error_reason(error, importing=True)}") from error
    except (Exception, SystemExit) as error:  # noqa: BLE001 - the module exists but fails while importing
        raise UserCodeError(f"{where_it_failed(error, module_file(name))}: {error_reason(error, importing=True)}") from error


def module_file(name: str) -> str | None:
    """The source file of the importable module ``name``, if it can be found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except Exception:  # noqa: BLE001 - a parent package that fails to import
        return None
    return spec.origin if spec is not None else None


def call_with_time_budget(function: Callable[..., T], *args: Any, timeout_s: float | None, what: str, **kwargs: Any) -> T:
    """``function(*args, **kwargs)``, or :class:`TimeBudgetError` naming ``what`` after ``timeout_s`` seconds.

    The call runs in a daemon thread; its exception (any, ``SystemExit`` included) is raised here
    with its own traceback. After a time-out the thread cannot be stopped (see the module doc):
    the caller must end the run. ``timeout_s`` None calls ``function`` directly, without a limit.
    """
    if timeout_s is None:
        return function(*args, **kwargs)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - handed back to the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=target, name=f"polyrl-budget {what}"[:60], daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise TimeBudgetError(
            f"{what} did not return within {timeout_s:g} s; the run stops here (a Python call cannot be interrupted, "
            "so it may still be running)"
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
