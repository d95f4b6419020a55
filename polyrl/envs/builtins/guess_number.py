"""``guess_number``: find a hidden integer with higher/lower feedback (no tools).

Rows give ``low``, ``high`` and the hidden ``target`` (``polyrl/tasks/guess_number.py``). Each
assistant turn's last integer is its guess; the environment answers "Higher." or "Lower." (a user
message) until the guess is right. Reward: ``solved`` on the turn that finds it (then the episode
ends), ``0`` otherwise; a turn without a number gets "Please answer with a number." and counts
as a turn. Failing within ``rollout.episodes.max_turns`` leaves the return at 0, so the reward
rewards solving within the turn budget, and multi-turn credit assignment is exercised without tools.
"""

from __future__ import annotations

from typing import Any

from polyrl.envs.base import EnvConfigError, EpisodeRow, Step
from polyrl.envs.builtins.calculator import last_integer
from polyrl.envs.registry import register_env


@register_env("guess_number")
class GuessNumberEnv:
    """Find a hidden number with higher/lower feedback; reward for solving within the turns."""

    tools: list[Any] = []

    def __init__(self, solved: float = 1.0):
        self.solved = float(solved)
        self.target = 0

    def start(self, row: EpisodeRow) -> list[dict[str, Any]]:
        if row.get("target") is None:  # the data source guess_number gives it; other sources do not
            raise EnvConfigError(
                f"guess_number plays rows with a 'target' column (the hidden number), as data source guess_number "
                f"gives them; this row's columns: {', '.join(['prompt', *row.fields])}"
            )
        self.target = int(row["target"])
        return [{"role": "user", "content": row.prompt}]

    def step(self, text: str) -> Step:
        guess = last_integer(text)
        if guess is None:
            return Step([{"role": "user", "content": "Please answer with a number."}], solved=False)
        if guess == self.target:
            return Step(reward=self.solved, done=True, solved=True)
        return Step([{"role": "user", "content": "Higher." if guess < self.target else "Lower."}], solved=False)
