"""The shipped environments (registered on import)."""

from polyrl.envs.builtins import calculator, guess_number, python_tool, textarena  # noqa: F401
