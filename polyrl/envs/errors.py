"""The configuration error of environments and tools, in a module of its own: the tools and the
sandbox refuse settings with it, and the environment base class imports the tools lazily, so
neither may import the other's module for it."""

from __future__ import annotations

from polyrl.core.errors import PolyrlError

__all__ = ["EnvConfigError"]


class EnvConfigError(PolyrlError, ValueError):
    """An environment is configured wrongly: unknown reference, bad parameter, bad messages."""
