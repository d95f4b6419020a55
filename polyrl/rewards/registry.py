"""Finding reward module classes from the reference written in a YAML file.

A reference is one of:
- a registered name (``rouge_l``), from ``@register_reward`` on a class;
- ``package.module:Class`` — an importable module;
- ``path/to/file.py:Class`` — a file, loaded only because this reference names it;
- the name of an entry point in group ``polyrl.rewards`` of an installed package.
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
from polyrl.rewards.base import RewardConfigError, module_label

ENTRY_POINT_GROUP = "polyrl.rewards"

_REGISTRY: dict[str, type] = {}
_FILE_MODULES: dict[Path, object] = {}

T = TypeVar("T", bound=type)


def register_reward(name: str) -> Callable[[T], T]:
    """Class decorator: register a reward module under ``name`` and set ``cls.name``."""
    if not name or not isinstance(name, str):
        raise RewardConfigError(f"reward name must be a non-empty string, got {name!r}")

    def decorate(cls: T) -> T:
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not cls:
            same_definition = (existing.__module__, existing.__qualname__) == (cls.__module__, cls.__qualname__)
            if not same_definition:  # a re-import of the same class is fine; a clash is not
                raise RewardConfigError(
                    f"reward name {name!r} is already registered to {existing.__module__}.{existing.__qualname__}"
                )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def registered_rewards() -> dict[str, type]:
    """Registered name → class, for every module registered so far (built-ins included)."""
    _ensure_builtins()
    return dict(sorted(_REGISTRY.items()))


def reward_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Entry points in group ``polyrl.rewards`` of installed packages, by name."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


# Built-in rewards that score with a model (judge, learned_scorer) live above the engines they need
# (polyrl/reward_models); imported by name, as plug-ins are, so that the layers still point down.
MODEL_REWARDS_PACKAGE = "polyrl.reward_models"


def _ensure_builtins() -> None:
    importlib.import_module("polyrl.rewards.builtins")
    importlib.import_module(MODEL_REWARDS_PACKAGE)


def _load_failed(ref: str, error: UserCodeError) -> RewardConfigError:
    return RewardConfigError(f"reward module {ref!r} failed to load: {error}")


def _load_file(path: Path, ref: str) -> object:
    path = path.resolve()
    if path in _FILE_MODULES:
        return _FILE_MODULES[path]
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    try:
        module = import_user_file(path, f"polyrl_reward_file_{path.stem}_{digest}")
    except UserCodeError as error:
        raise _load_failed(ref, error) from error
    _FILE_MODULES[path] = module
    return module


def _import_target(target: str, ref: str) -> object:
    try:
        return import_user_module(target)
    except ModuleNotFoundError as error:  # the module itself is not there
        raise RewardConfigError(f"reward module {ref!r}: cannot import {target!r}: {error}") from error
    except UserCodeError as error:
        raise _load_failed(ref, error) from error


def _unknown(ref: str, why: str = "") -> RewardConfigError:
    names = ", ".join(registered_rewards()) or "(none)"
    plugged = ", ".join(sorted(reward_entry_points())) or "(none)"
    detail = f" ({why})" if why else ""
    return RewardConfigError(
        f"unknown reward module {ref!r}{detail}. Registered names: {names}. Entry points: {plugged}. "
        "Or use 'package.module:Class' or 'path/to/file.py:Class'."
    )


def load_reward_class(ref: str, *, base_dir: str | Path | None = None) -> type:
    """Resolve a module reference to its class (see the module docstring for the forms).

    Relative file paths are resolved against ``base_dir`` when given (e.g. the directory of
    the experiment YAML), else the current directory. Raises :class:`RewardConfigError`.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise RewardConfigError(f"reward module reference must be a non-empty string, got {ref!r}")
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
                raise RewardConfigError(f"reward module {ref!r}: file {str(path)!r} does not exist")
            module = _load_file(path, ref)
        else:
            module = _import_target(target, ref)
        cls = getattr(module, attr, None)
        if cls is None:
            raise RewardConfigError(f"reward module {ref!r}: {target!r} has no attribute {attr!r}")
        if not isinstance(cls, type) or not callable(getattr(cls, "score", None)):
            raise RewardConfigError(f"reward module {ref!r} is not a class with a score(batch) method")
        return cls

    entry_points = reward_entry_points()
    if ref in entry_points:
        try:
            cls = entry_points[ref].load()
        except (Exception, SystemExit) as error:  # noqa: BLE001 - report any plug-in import failure as config
            raise RewardConfigError(
                f"reward entry point {ref!r} ({entry_points[ref].value}) failed to load: "
                f"{where_it_failed(error, module_file(entry_points[ref].module))}: {error_reason(error, importing=True)}"
            ) from error
        if not isinstance(cls, type) or not callable(getattr(cls, "score", None)):
            raise RewardConfigError(f"reward entry point {ref!r} is not a class with a score(batch) method")
        return cls

    raise _unknown(ref)


def bind_params(cls: type, params: dict[str, Any], *, ref: str, label: str | None = None) -> None:
    """Check that ``params`` fit the constructor of ``cls`` without running it."""
    label = label or module_label(cls)
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # a constructor without a signature (C extension): nothing to check
        return
    try:
        signature.bind(**params)
    except TypeError as error:
        accepted = [name for name, p in signature.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        raise RewardConfigError(
            f"reward {label!r} ({ref}): bad params {params}: {error}; accepted: {', '.join(accepted) or '(none)'}"
        ) from None


def build_reward(cls: type, params: dict[str, Any], *, ref: str, label: str | None = None) -> Any:
    """``cls(**params)``, with any failure reported as one message naming the file and line.

    The params are bound to the signature first, so a typo is named as such; a
    :class:`PolyrlError` from the constructor (a module's own parameter check) passes through.
    """
    label = label or module_label(cls)
    bind_params(cls, params, ref=ref, label=label)
    try:
        return cls(**params)
    except PolyrlError:
        raise
    except (Exception, SystemExit) as error:  # noqa: BLE001 - any constructor failure is the reward author's to fix
        try:
            source = inspect.getsourcefile(cls)
        except TypeError:
            source = None
        raise RewardConfigError(
            f"reward {label!r} ({ref}) failed in __init__ with params {params}: {where_it_failed(error, source)}: {error_reason(error)}"
        ) from error
