"""The one base class of every error polyrl raises for a user to read.

The CLI catches :class:`PolyrlError` and prints its message (exit 2) instead of a traceback;
anything else is a bug and keeps its traceback. This module imports nothing of polyrl, so
every layer can raise these errors.
"""

from __future__ import annotations


class PolyrlError(Exception):
    """An error whose message is meant for the user, not a traceback."""
