"""Data sources written as ``<kind>:<name>?param=value&...`` (``reasoning_gym:``, ``textarena:``):
the parameters after ``?`` as pairs, and the "did you mean" hint for a misspelt name. Each
source's own module checks the names and values it accepts."""

from __future__ import annotations

import difflib
from urllib.parse import unquote

from polyrl.data.errors import DataConfigError

__all__ = ["did_you_mean", "source_params"]


def source_params(source: str, query: str) -> list[tuple[str, str]]:
    """The ``name=value`` pairs of ``query`` (what follows ``?`` in ``source``), in order; refused,
    naming ``source``, when it is not pairs joined by ``&``. A value is taken as written, ``+``
    included (``operators=["+","-"]``): a web form's ``+``-for-space (``parse_qsl``) turned that
    into ``[" ","-"]``. ``%XX`` escapes are decoded, for a value holding ``&`` or ``=``."""
    pairs = []
    for part in query.split("&") if query else []:
        name, equals, value = part.partition("=")
        if not equals or not name:
            raise DataConfigError(
                f"data source {source!r}: the params after '?' must be name=value pairs joined by '&'; {part!r} is not one"
            )
        pairs.append((unquote(name), unquote(value)))
    return pairs


def did_you_mean(name: str, allowed: list[str], *, most: int = 5) -> list[str]:
    """The allowed names closest to a misspelt ``name`` (difflib's ratio at least 0.5)."""
    return difflib.get_close_matches(name, allowed, n=most, cutoff=0.5)
