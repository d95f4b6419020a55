"""The data layer's user-facing error, below both ``prompts`` and ``images`` (each raises it)."""

from __future__ import annotations

from polyrl.core.errors import PolyrlError


class DataConfigError(PolyrlError, ValueError):
    """A dataset source or field configuration that cannot be loaded."""
