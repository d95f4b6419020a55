"""The experiment YAML reference as Markdown, generated from the pydantic schema.

The documentation site (``docs/hooks/generate.py``) calls :func:`schema_reference_markdown` at
build time, so the reference lists exactly the fields :class:`ExperimentConfig` accepts: every
field with its type, default, allowed values and description, one table per section, sections
nested as the YAML nests them. Nothing here is written by hand, so it cannot drift from the code.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from polyrl.config.schema import ExperimentConfig

_BOUNDS = ((Gt, "gt", ">"), (Ge, "ge", "≥"), (Lt, "lt", "<"), (Le, "le", "≤"))


def section_anchor(path: str) -> str:
    """The HTML id of a section's heading: ``model.builtin`` → ``config-model-builtin``."""
    return "config-" + path.replace(".", "-").replace("[]", "")


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation (``X | None``, ``list[X]``, ``bool | X``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for argument in get_args(annotation):
        found += _nested_models(argument)
    return found


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) is Union or isinstance(annotation, types.UnionType)


def type_name(annotation: Any, path: str = "") -> str:
    """A reader's name for a field's type: ``integer``, ``number or null``, ``list of mapping``..."""
    if annotation is type(None):
        return "null"
    if _is_union(annotation):
        return " or ".join(type_name(argument, path) for argument in get_args(annotation))
    origin = get_origin(annotation)
    if origin is Literal:
        return "string" if all(isinstance(choice, str) for choice in get_args(annotation)) else "choice"
    if origin in (list, typing.List):  # noqa: UP006 - both spellings occur
        (item,) = get_args(annotation) or (Any,)
        return f"list of {type_name(item, path + '[]')}"
    if origin is tuple:
        return "[" + ", ".join(type_name(item, path) for item in get_args(annotation)) + "]"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[mapping](#{section_anchor(path)})" if path else "mapping"
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if annotation in simple:
        return simple[annotation]
    return "any" if annotation is Any else getattr(annotation, "__name__", str(annotation))


def _literal_choices(annotation: Any) -> list[Any]:
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    return [choice for argument in get_args(annotation) if _is_union(annotation) for choice in _literal_choices(argument)]


def _yaml_value(value: Any) -> str:
    """A value as it is written in YAML (``null``, ``true``, ``0.2``, ``'auto'`` as ``auto``)."""
    if isinstance(value, list) and value and all(isinstance(item, BaseModel) for item in value):
        value = [item.model_dump(mode="json", exclude_defaults=True) for item in value]
    value = to_jsonable_python(value)
    if isinstance(value, str):
        return value if value else "''"
    return json.dumps(value, ensure_ascii=False).replace('"', "")


def allowed_values(field: FieldInfo) -> str:
    """Choices and bounds of a field: ``vllm, hf``; ``≥ 1``; ``> 0 and ≤ 1``; empty when any value of its type goes."""
    parts = []
    choices = _literal_choices(field.annotation)
    if choices:
        parts.append(", ".join(f"`{_yaml_value(choice)}`" for choice in choices))
    for item in field.metadata:
        for kind, attribute, word in _BOUNDS:
            if isinstance(item, kind):
                parts.append(f"{word} {getattr(item, attribute)}")
        if isinstance(item, MinLen):
            parts.append(f"length ≥ {item.min_length}")
        if isinstance(item, MaxLen):
            parts.append(f"length ≤ {item.max_length}")
    return "; ".join(parts)


def default_value(field: FieldInfo) -> str:
    """The default as YAML, ``required`` for a field without one, ``(section)`` for a nested section's own defaults."""
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return "(its fields' defaults)"
    return f"`{_yaml_value(value)}`"


def _text(text: str) -> str:
    """Prose from the code as Markdown text: one line, and no character Markdown would read as
    HTML or emphasis (``<img>`` in a description would become an image tag)."""
    text = " ".join(text.split())
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def _section_summary(annotation: Any) -> str:
    """For a field that is a section of its own: the first sentence of the section's docstring."""
    for model in _nested_models(annotation):
        doc = inspect.cleandoc(model.__doc__ or "")
        if doc:
            return doc.split("\n\n")[0].split(". ")[0].rstrip(".") + " (section below)."
        return "Its own section (below)."
    return ""


def _cell(text: str) -> str:
    """Table-cell safe: no line breaks, no bare pipes."""
    return " ".join(text.split()).replace("|", "\\|")


def iter_sections(model: type[BaseModel] = ExperimentConfig, path: str = "") -> list[tuple[str, type[BaseModel]]]:
    """Every section of the schema as ``(dotted path, model)``, depth first, the root as ``""``."""
    sections = [(path, model)]
    for name, field in model.model_fields.items():
        child = f"{path}.{name}" if path else name
        for nested in _nested_models(field.annotation):
            suffix = "[]" if get_origin(field.annotation) is list else ""
            sections += iter_sections(nested, child + suffix)
    return sections


def section_markdown(path: str, model: type[BaseModel]) -> str:
    """One section: its heading, its class docstring, and a table of its fields."""
    level = "#" * min(2 + path.count("."), 4)
    heading = f"`{path}`" if path else "Top-level keys"
    lines = [f"{level} {heading} {{ #{section_anchor(path) if path else 'config-top-level'} }}", ""]
    doc = inspect.cleandoc(model.__doc__ or "")
    if doc and model is not ExperimentConfig:
        lines += [_text(doc.split("\n\n")[0]), ""]
    lines += [f"Python: `{model.__module__}.{model.__qualname__}`", ""]
    lines += ["| field | type | default | allowed | description |", "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        child = f"{path}.{name}" if path else name
        if get_origin(field.annotation) is list:
            child += "[]"
        cells = (
            f"`{name}`",
            type_name(field.annotation, child),
            default_value(field),
            allowed_values(field),
            _text(field.description or _section_summary(field.annotation)),
        )
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def schema_reference_markdown() -> str:
    """The whole reference: the top-level keys, then each section in YAML order."""
    return "\n".join(section_markdown(path, model) for path, model in iter_sections())


def all_field_paths() -> list[str]:
    """Every field's dotted path (``rollout.worker_resources.num_cpus``, ``rewards[].weight``)."""
    paths = []
    for path, model in iter_sections():
        for name, field in model.model_fields.items():
            suffix = "[]" if get_origin(field.annotation) is list else ""
            paths.append((f"{path}.{name}" if path else name) + suffix)
    return paths
