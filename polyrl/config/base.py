"""What every config section shares: the strict base model, the user-facing ConfigError, and the
rule for names that become folders and run names."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from polyrl.core.errors import PolyrlError


class ConfigError(PolyrlError, ValueError):
    """A config that cannot be used; the message is meant for the user, not a traceback."""


def check_safe_name(name: str, why: str) -> str:
    """Names that become folder and run names: letters, digits, '_', '.', '-' only, and not
    '.' or '..' (which would name the folder itself or its parent)."""
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or set(name) == {"."}:
        raise ValueError(f"must use only letters, digits, '_', '.', '-' and not be '.' or '..' ({why})")
    return name


class StrictModel(BaseModel):
    # Every float of the schema is finite unless a field says otherwise: `.inf` or `.nan` in
    # a YAML file is refused at load time, not after a step has written non-finite weights.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
