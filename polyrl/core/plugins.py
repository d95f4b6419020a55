"""Resolving a plug-in reference written in a YAML file to its class (reward modules, environments).

Every kind of plug-in is named the same four ways, tried in this order:
- a registered name (``rouge_l``, ``calculator``), from the kind's ``@register_...`` decorator;
- ``package.module:Class`` — an importable module;
- ``path/to/file.py:Class`` — a file, loaded only because this reference names it (relative
  paths against ``base_dir``, e.g. the experiment YAML's folder);
- the name of an entry point in the kind's group of an installed package.

The kinds differ only in what :class:`PluginKind` holds (their noun in messages, registry,
entry-point group, error class and the methods their class must have), so that a rule added
here (how a file is imported, what a failure says) holds for all of them. The user's file or
module is imported by :mod:`polyrl.core.user_code`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, MutableMapping, TypeVar

from polyrl.core.errors import PolyrlError
from polyrl.core.user_code import UserCodeError, error_reason, import_user_file, import_user_module, module_file, where_it_failed

__all__ = ["PluginKind", "entry_points", "load_plugin_class", "register_plugin", "registered_plugins"]

T = TypeVar("T", bound=type)


@dataclass(frozen=True)
class PluginKind:
    """What differs between kinds of plug-in; see the module docstring."""

    noun: str  # in messages: "reward module", "environment"
    name_noun: str  # in messages about a registered name: "reward", "environment"
    entry_point_noun: str  # "reward entry point", "environment entry point"
    group: str  # entry-point group: "polyrl.rewards"
    error: type[PolyrlError]  # raised for every failure to resolve
    registry: MutableMapping[str, type]  # registered name -> class (filled by register_plugin)
    ensure_builtins: Callable[[], None]  # imports the modules that register the built-ins
    methods: tuple[str, ...]  # a class of the kind has these methods: ("score",)
    wants: str  # the same, for the message: "a class with a score(batch) method"
    file_module_prefix: str  # sys.modules name of a loaded file: "<prefix>_<stem>_<digest>"
    # The noun the class check names for an entry point (rewards say "reward entry point",
    # environments "environment"): kept as each kind's message has always been.
    entry_point_check_noun: str
    # Loaded files by resolved path: a file is imported once per process, as the kind's module.
    file_modules: dict[Path, object] = field(default_factory=dict, compare=False, repr=False)


def register_plugin(kind: PluginKind, name: str) -> Callable[[T], T]:
    """Class decorator: register a class of ``kind`` under ``name`` and set ``cls.name``."""
    if not name or not isinstance(name, str):
        raise kind.error(f"{kind.name_noun} name must be a non-empty string, got {name!r}")

    def decorate(cls: T) -> T:
        existing = kind.registry.get(name)
        # a re-import of the same class (same module and name) is fine; a clash is not
        if existing is not None and (existing.__module__, existing.__qualname__) != (cls.__module__, cls.__qualname__):
            raise kind.error(
                f"{kind.name_noun} name {name!r} is already registered to {existing.__module__}.{existing.__qualname__}"
            )
        cls.name = name
        kind.registry[name] = cls
        return cls

    return decorate


def registered_plugins(kind: PluginKind) -> dict[str, type]:
    """Registered name -> class, sorted by name, built-ins included."""
    kind.ensure_builtins()
    return dict(sorted(kind.registry.items()))


def entry_points(kind: PluginKind) -> dict[str, importlib.metadata.EntryPoint]:
    """Entry points in ``kind.group`` of installed packages, by name."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=kind.group)}


def _load_failed(kind: PluginKind, ref: str, error: UserCodeError) -> PolyrlError:
    return kind.error(f"{kind.noun} {ref!r} failed to load: {error}")


def _load_file(kind: PluginKind, path: Path, ref: str) -> object:
    path = path.resolve()
    if path in kind.file_modules:
        return kind.file_modules[path]
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    try:
        module = import_user_file(path, f"{kind.file_module_prefix}_{path.stem}_{digest}")
    except UserCodeError as error:
        raise _load_failed(kind, ref, error) from error
    kind.file_modules[path] = module
    return module


def _import_target(kind: PluginKind, target: str, ref: str) -> object:
    try:
        return import_user_module(target)
    except ModuleNotFoundError as error:  # the module itself is not there
        raise kind.error(f"{kind.noun} {ref!r}: cannot import {target!r}: {error}") from error
    except UserCodeError as error:
        raise _load_failed(kind, ref, error) from error


def _checked(kind: PluginKind, cls: Any, label: str) -> type:
    if not isinstance(cls, type) or not all(callable(getattr(cls, method, None)) for method in kind.methods):
        raise kind.error(f"{label} is not {kind.wants}")
    return cls


def _unknown(kind: PluginKind, ref: str, why: str = "") -> PolyrlError:
    names = ", ".join(sorted(kind.registry)) or "(none)"
    plugged = ", ".join(sorted(entry_points(kind))) or "(none)"
    detail = f" ({why})" if why else ""
    return kind.error(
        f"unknown {kind.noun} {ref!r}{detail}. Registered names: {names}. Entry points: {plugged}. "
        "Or use 'package.module:Class' or 'path/to/file.py:Class'."
    )


def load_plugin_class(kind: PluginKind, ref: str, *, base_dir: str | Path | None = None) -> type:
    """Resolve ``ref`` to a class of ``kind``; every failure raises ``kind.error`` naming the reference."""
    if not isinstance(ref, str) or not ref.strip():
        raise kind.error(f"{kind.noun} reference must be a non-empty string, got {ref!r}")
    ref = ref.strip()
    kind.ensure_builtins()
    if ref in kind.registry:
        return kind.registry[ref]

    if ":" in ref:
        target, _, attr = ref.rpartition(":")
        if not target or not attr:
            raise _unknown(kind, ref, "expected 'module:Class' or 'file.py:Class'")
        if target.endswith(".py") or "/" in target or "\\" in target:
            path = Path(target).expanduser()
            if not path.is_absolute() and base_dir is not None:
                path = Path(base_dir) / path
            if not path.is_file():
                raise kind.error(f"{kind.noun} {ref!r}: file {str(path)!r} does not exist")
            module = _load_file(kind, path, ref)
        else:
            module = _import_target(kind, target, ref)
        cls = getattr(module, attr, None)
        if cls is None:
            raise kind.error(f"{kind.noun} {ref!r}: {target!r} has no attribute {attr!r}")
        return _checked(kind, cls, f"{kind.noun} {ref!r}")

    plugged = entry_points(kind)
    if ref in plugged:
        try:
            cls = plugged[ref].load()
        except (Exception, SystemExit) as error:  # noqa: BLE001 - any plug-in import failure is a config error
            raise kind.error(
                f"{kind.entry_point_noun} {ref!r} ({plugged[ref].value}) failed to load: "
                f"{where_it_failed(error, module_file(plugged[ref].module))}: {error_reason(error, importing=True)}"
            ) from error
        return _checked(kind, cls, f"{kind.entry_point_check_noun} {ref!r}")

    raise _unknown(kind, ref)
