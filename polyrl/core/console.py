"""The one console on stderr for polyrl's own error lines.

It lives here, below every layer, because both the commands (``polyrl.cli``) and the run-log
redirection (``polyrl.launch.logs``) must point the same console at the terminal.
"""

from __future__ import annotations

from rich.console import Console

error_console = Console(stderr=True)
