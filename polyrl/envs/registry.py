"""Finding environment classes from the reference written in a YAML file (``env.module``).

A reference is one of, exactly as for reward modules (:mod:`polyrl.rewards.registry`); the
user's file or module is imported by :mod:`polyrl.core.user_code`, as rewards are:
- a registered name (``calculator``), from ``@register_env`` on a class;
- ``package.module:Class`` — an importable module;
- ``path/to/file.py:Class`` — a file, loaded only because this reference names it;
- the name of an entry point in group ``polyrl.envs`` of an installed package.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
from pathlib import Path
from typing import Any, Callable, TypeVar

from polyrl.core.errors import PolyrlError
from polyrl.core.user_code import UserCodeError, error_reason, import_user_file, import_user_module, module_file, where_it_failed
from polyrl.envs.base import EnvConfigError

__all__ = ["ENTRY_POINT_GROUP", "build_env", "env_entry_points", "load_env_class", "register_env", "registered_envs"]

ENTRY_POINT_GROUP = "polyrl.envs"

_REGISTRY: dict[str, type] = {}
_FILE_MODULES: dict[Path, object] = {}
T = TypeVar("T", bound=type)


def register_env(name: str) -> Callable[[T], T]:
    """Class decorator: register an environment under ``name`` and set ``cls.name``."""
    if not name or not isinstance(name, str):
        raise EnvConfigError(f"environment name must be a non-empty string, got {name!r}")

    def decorate(cls: T) -> T:
        existing = _REGISTRY.get(name)
        if existing is not None and (existing.__module__, existing.__qualname__) != (cls.__module__, cls.__qualname__):
            raise EnvConfigError(
                f"environment name {name!r} is already registered to {existing.__module__}.{existing.__qualname__}"
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def _ensure_builtins() -> None:
    importlib.import_module("polyrl.envs.builtins")


def registered_envs() -> dict[str, type]:
    _ensure_builtins()
    return dict(sorted(_REGISTRY.items()))


def env_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load_file(path: Path, ref: str) -> object:
    path = path.resolve()
    if path not in _FILE_MODULES:
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
        try:
            _FILE_MODULES[path] = import_user_file(path, f"polyrl_env_file_{path.stem}_{digest}")
        except UserCodeError as error:
            raise EnvConfigError(f"environment {ref!r} failed to load: {error}") from error
    return _FILE_MODULES[path]


def _import_target(target: str, ref: str) -> object:
    try:
        return import_user_module(target)
    except ModuleNotFoundError as error:
        raise EnvConfigError(f"environment {ref!r}: cannot import {target!r}: {error}") from error
    except UserCodeError as error:
        raise EnvConfigError(f"environment {ref!r} failed to load: {error}") from error


def _checked(cls: Any, ref: str) -> type:
    if not isinstance(cls, type) or not callable(getattr(cls, "start", None)) or not callable(getattr(cls, "step", None)):
        raise EnvConfigError(f"environment {ref!r} is not a class with start(row) and step(text) methods")
    return cls


def _unknown(ref: str, why: str = "") -> EnvConfigError:
    names = ", ".join(registered_envs()) or "(none)"
    plugged = ", ".join(sorted(env_entry_points())) or "(none)"
    detail = f" ({why})" if why else ""
    return EnvConfigError(
        f"unknown environment {ref!r}{detail}. Registered names: {names}. Entry points: {plugged}. "
        "Or use 'package.module:Class' or 'path/to/file.py:Class'."
    )


def load_env_class(ref: str, *, base_dir: str | Path | None = None) -> type:
    """Resolve an environment reference to its class; relative file paths against ``base_dir``."""
    if not isinstance(ref, str) or not ref.strip():
        raise EnvConfigError(f"environment reference must be a non-empty string, got {ref!r}")
    ref = ref.strip()
    _ensure_builtins()
    if ref in _REGISTRY:
        return _REGISTRY[ref]
    if ":" in ref:
        target, _, attr = ref.rpartition(":")
        if not target or not attr:
            raise _unknown(ref, "expected 'module:Class' or 'file.py:Class'")
        if target.endswith(".py") or "/" in target or "\\" in target:
            path = Path(target).expanduser()
            if not path.is_absolute() and base_dir is not None:
                path = Path(base_dir) / path
            if not path.is_file():
                raise EnvConfigError(f"environment {ref!r}: file {str(path)!r} does not exist")
            module = _load_file(path, ref)
        else:
            module = _import_target(target, ref)
        cls = getattr(module, attr, None)
        if cls is None:
            raise EnvConfigError(f"environment {ref!r}: {target!r} has no attribute {attr!r}")
        return _checked(cls, ref)
    entry_points = env_entry_points()
    if ref in entry_points:
        try:
            cls = entry_points[ref].load()
        except (Exception, SystemExit) as error:  # noqa: BLE001 - any plug-in import failure is a config error
            raise EnvConfigError(
                f"environment entry point {ref!r} ({entry_points[ref].value}) failed to load: "
                f"{where_it_failed(error, module_file(entry_points[ref].module))}: {error_reason(error, importing=True)}"
            ) from error
        return _checked(cls, ref)
    raise _unknown(ref)


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
