"""Finding environment classes from the reference written in a YAML file (``env.module``).

A reference is one of, exactly as for reward modules (both are resolved by
:mod:`polyrl.core.plugins`, which imports the user's file or module through :mod:`polyrl.core.user_code`):
- a registered name (``calculator``), from ``@register_env`` on a class;
- ``package.module:Class`` — an importable module;
- ``path/to/file.py:Class`` — a file, loaded only because this reference names it;
- the name of an entry point in group ``polyrl.envs`` of an installed package.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from pathlib import Path
from typing import Any, Callable, TypeVar

from polyrl.core.errors import PolyrlError
from polyrl.core.plugins import PluginKind, entry_points, load_plugin_class, register_plugin, registered_plugins
from polyrl.core.user_code import error_reason, where_it_failed
from polyrl.envs.base import EnvConfigError

__all__ = ["ENTRY_POINT_GROUP", "build_env", "env_entry_points", "load_env_class", "register_env", "registered_envs"]

ENTRY_POINT_GROUP = "polyrl.envs"

_REGISTRY: dict[str, type] = {}
T = TypeVar("T", bound=type)


def register_env(name: str) -> Callable[[T], T]:
    """Class decorator: register an environment under ``name`` and set ``cls.name``."""
    return register_plugin(ENV_PLUGINS, name)


def _ensure_builtins() -> None:
    importlib.import_module("polyrl.envs.builtins")


def registered_envs() -> dict[str, type]:
    return registered_plugins(ENV_PLUGINS)


def env_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return entry_points(ENV_PLUGINS)


ENV_PLUGINS = PluginKind(
    noun="environment",
    name_noun="environment",
    entry_point_noun="environment entry point",
    group=ENTRY_POINT_GROUP,
    error=EnvConfigError,
    registry=_REGISTRY,
    ensure_builtins=_ensure_builtins,
    methods=("start", "step"),
    wants="a class with start(row) and step(text) methods",
    file_module_prefix="polyrl_env_file",
    entry_point_check_noun="environment",
)


def load_env_class(ref: str, *, base_dir: str | Path | None = None) -> type:
    """Resolve an environment reference to its class; relative file paths against ``base_dir``."""
    return load_plugin_class(ENV_PLUGINS, ref, base_dir=base_dir)


def bind_env_params(cls: type, params: dict[str, Any], *, ref: str) -> None:
    """Check that ``params`` fit the constructor of ``cls`` without running it."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(**params)
    except TypeError as error:
        accepted = [n for n, p in signature.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        raise EnvConfigError(
            f"env.params for {ref!r}: bad params {params}: {error}; accepted: {', '.join(accepted) or '(none)'}"
        ) from None


def build_env(cls: type, params: dict[str, Any], *, ref: str) -> Any:
    """``cls(**params)``; a failure is one message naming the file and line."""
    bind_env_params(cls, params, ref=ref)
    try:
        return cls(**params)
    except PolyrlError:
        raise
    except (Exception, SystemExit) as error:  # noqa: BLE001 - any constructor failure is the author's to fix
        try:
            source = inspect.getsourcefile(cls)
        except TypeError:
            source = None
        raise EnvConfigError(
            f"environment {ref!r} failed in __init__ with params {params}: "
            f"{where_it_failed(error, source)}: {error_reason(error)}"
        ) from error
