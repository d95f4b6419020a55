"""Finding reward module classes from the reference written in a YAML file.

A reference is one of:
- a registered name (``rouge_l``), from ``@register_reward`` on a class;
- ``package.module:Class`` — an importable module;
- ``path/to/file.py:Class`` — a file, loaded only because this reference names it;
- the name of an entry point in group ``polyrl.rewards`` of an installed package.

The resolution is in :mod:`polyrl.core.plugins`, shared with environments; this module holds the
registry and what makes a class a reward module.
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
from polyrl.rewards.base import RewardConfigError, module_label

ENTRY_POINT_GROUP = "polyrl.rewards"

_REGISTRY: dict[str, type] = {}

T = TypeVar("T", bound=type)


def register_reward(name: str) -> Callable[[T], T]:
    """Class decorator: register a reward module under ``name`` and set ``cls.name``."""
    return register_plugin(REWARD_PLUGINS, name)


def registered_rewards() -> dict[str, type]:
    """Registered name → class, for every module registered so far (built-ins included)."""
    return registered_plugins(REWARD_PLUGINS)


def reward_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Entry points in group ``polyrl.rewards`` of installed packages, by name."""
    return entry_points(REWARD_PLUGINS)


# Built-in rewards that score with a model (judge, learned_scorer) live above the engines they need
# (polyrl/reward_models); imported by name, as plug-ins are, so that the layers still point down.
MODEL_REWARDS_PACKAGE = "polyrl.reward_models"


def _ensure_builtins() -> None:
    importlib.import_module("polyrl.rewards.builtins")
    importlib.import_module(MODEL_REWARDS_PACKAGE)


REWARD_PLUGINS = PluginKind(
    noun="reward module",
    name_noun="reward",
    entry_point_noun="reward entry point",
    group=ENTRY_POINT_GROUP,
    error=RewardConfigError,
    registry=_REGISTRY,
    ensure_builtins=_ensure_builtins,
    methods=("score",),
    wants="a class with a score(batch) method",
    file_module_prefix="polyrl_reward_file",
    entry_point_check_noun="reward entry point",
)


def load_reward_class(ref: str, *, base_dir: str | Path | None = None) -> type:
    """Resolve a module reference to its class (see the module docstring for the forms).

    Relative file paths are resolved against ``base_dir`` when given (e.g. the directory of
    the experiment YAML), else the current directory. Raises :class:`RewardConfigError`.
    """
    return load_plugin_class(REWARD_PLUGINS, ref, base_dir=base_dir)


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
