"""Typed parameters of objectives and advantage estimators.

Each registration declares its parameters as a :class:`Params` model: strict scalar types
(``clip_low: "0.2"`` and ``use_std: 1`` are refused, an int is accepted where a float is
expected), ranges, finite floats only. ``polyrl validate`` checks ``objective.params`` and
``advantage.params`` against these models, so a bad value is reported at load time with its
field path and allowed values, never at the first loss call.

Declare a parameter with :func:`number` / :func:`flag` (or a plain pydantic ``Field``; a
``Literal`` type lists its choices). The registry reads the defaults with :func:`param_defaults`.
"""

from __future__ import annotations

from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError


class Params(BaseModel):
    """Base of every registration's parameter model."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


def number(default: float | None, *, description: str, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None) -> Any:  # fmt: skip
    """A finite float parameter (ints accepted, strings and booleans refused) within bounds."""
    return Field(default, description=description, strict=True, ge=ge, gt=gt, le=le, lt=lt)


def flag(default: bool, *, description: str) -> Any:
    """A boolean parameter: only ``true``/``false`` (no 0/1, no strings)."""
    return Field(default, description=description, strict=True)


def param_defaults(model: type[Params]) -> dict[str, Any]:
    return model().model_dump()


_BOUND_WORDS = ((Gt, "gt", ">"), (Ge, "ge", ">="), (Lt, "lt", "<"), (Le, "le", "<="))


def describe_param(model: type[Params], name: str) -> str:
    """What a parameter accepts, e.g. ``number >= 0 and < 1``, ``number > 1, or null``."""
    field = model.model_fields[name]
    annotation = field.annotation
    nullable = False
    if get_origin(annotation) is Union or type(annotation).__name__ == "UnionType":
        arguments = [argument for argument in get_args(annotation) if argument is not type(None)]
        nullable = len(arguments) < len(get_args(annotation))
        annotation = arguments[0] if len(arguments) == 1 else annotation
    if get_origin(annotation) is Literal:
        text = " or ".join(repr(choice) for choice in get_args(annotation))
    elif annotation is bool:
        text = "true or false"
    elif annotation is int:
        text = "integer"
    elif annotation is float:
        text = "number"
    else:
        text = getattr(annotation, "__name__", str(annotation))
    bounds = [f"{word} {getattr(item, attribute)}" for item in field.metadata
              for kind, attribute, word in _BOUND_WORDS if isinstance(item, kind)]  # fmt: skip
    if bounds:
        text += " " + " and ".join(bounds)
    return text + (", or null" if nullable else "")


def _error(kind: str, message: str, loc: tuple[Any, ...], value: Any, allowed: str) -> InitErrorDetails:
    # Braces would be read as placeholders of the message template.
    template = message.replace("{", "(").replace("}", ")")
    return InitErrorDetails(type=PydanticCustomError(kind, template, {"allowed": allowed}), loc=loc, input=value)


def validate_params(model: type[Params], params: dict[str, Any], *, owner: str,
                    moved: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """The user's ``params`` checked against ``model``, as proper Python values (only the keys
    the user gave). Raises a pydantic ``ValidationError`` whose locations are parameter names and
    whose ``ctx['allowed']`` says what each parameter accepts. ``moved`` maps a key that has its
    home elsewhere to that home (``{"kl_coef": "train.kl_coef"}``): it is refused naming the home.
    """
    errors: list[InitErrorDetails] = []
    known = sorted(model.model_fields)
    for key, value in params.items():
        if moved and key in moved:
            errors.append(_error("moved_parameter", f"set {moved[key]} instead (one home per setting)", (key,), value, ""))
        elif key not in model.model_fields:
            errors.append(_error("unknown_parameter", f"unknown parameter for {owner}", (key,), value,
                                 ", ".join(known) or "(none)"))  # fmt: skip
    declared = {key: value for key, value in params.items() if key in model.model_fields}
    try:
        validated = model.model_validate(declared)
    except ValidationError as error:
        for item in error.errors():
            name = item["loc"][0] if item["loc"] else None
            allowed = describe_param(model, name) if name in model.model_fields else ""
            errors.append(_error(item["type"], item["msg"].removeprefix("Value error, "), tuple(item["loc"]),
                                 item.get("input"), allowed))  # fmt: skip
    if errors:
        raise ValidationError.from_exception_data(f"{owner} params", errors)
    return {key: getattr(validated, key) for key in params}
