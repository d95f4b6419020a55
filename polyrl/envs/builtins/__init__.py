"""The shipped environments (registered on import)."""

from polyrl.envs.builtins import calculator, guess_number  # noqa: F401
