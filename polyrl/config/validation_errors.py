"""Pydantic validation errors as polyrl reports them: one line per problem naming the field path,
the bad value and what is allowed (experiment configs and eval suites alike)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError


def _location(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def _allowed_values(error: Mapping[str, Any]) -> str:
    ctx = error.get("ctx") or {}
    if ctx.get("allowed"):
        return f"allowed: {ctx['allowed']}"
    if "expected" in ctx:
        return f"allowed: {ctx['expected']}"
    for bound, word in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        if bound in ctx:
            return f"allowed: {word} {ctx[bound]}"
    if error["type"] == "extra_forbidden":
        return ""
    return ""


def format_validation_error(
    error: ValidationError,
    *,
    source: str,
    prefix: tuple[Any, ...] = (),
    model: type[BaseModel] | None = None,
    what: str = "experiment config",
) -> str:
    """One line per problem: field path, message, the bad value and what is allowed (also used
    for eval suites, ``what="eval suite"``)."""
    lines = [f"{source}: invalid {what}"]
    for item in error.errors():
        loc = prefix + tuple(item["loc"])
        path = _location(loc)
        message = item["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        value = item.get("input")
        detail = f"  - {path}: {message}"
        if item["type"] == "extra_forbidden":
            siblings = _sibling_fields(model, tuple(item["loc"])[:-1]) if model else []
            detail = f"  - {path}: unknown field" + (f"; allowed: {', '.join(siblings)}" if siblings else "")
        elif item["type"] != "missing" and not isinstance(value, (dict, list)):
            detail += f" (got {value!r})"
        allowed = _allowed_values(item)
        if allowed and "allowed" not in detail:
            detail += f"; {allowed}"
        lines.append(detail)
    return "\n".join(lines)


def _sibling_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        current = _model_in(annotation)
    return sorted(getattr(current, "model_fields", {}).keys()) if current is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None
