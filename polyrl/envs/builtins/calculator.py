"""``calculator``: multiply a three-digit by a two-digit number, with a calculator tool.

Rows come from ``polyrl/tasks/calculator.py`` (fields ``a``, ``b``, ``answer``). The policy may
call ``calculator`` (plain-text protocol or the chat template's tool format,
:mod:`polyrl.envs.tools`) any number of times within the turn budget; its first turn without a
tool call is its final answer. Reward: ``correct`` when the last integer of that answer equals
``a × b``, else ``wrong`` (final-answer accuracy); plus ``format_reward`` once, on the first turn
whose tool calls all ran (a shaping term for a policy that does not call the tool yet; 0 by
default, so the return is the accuracy alone). The tool is evaluated by
:func:`polyrl.envs.safe_arithmetic.evaluate` (an ``ast`` allow-list), never ``eval``.
"""

from __future__ import annotations

import re
from typing import Any

from polyrl.envs.base import EpisodeRow, Step, ToolEnvironment
from polyrl.envs.registry import register_env
from polyrl.envs.safe_arithmetic import evaluate
from polyrl.envs.tools import tool

INTEGER = re.compile(r"-?\d[\d,]*")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses, e.g. "123 * 45".

    Returns the value as text."""
    value = evaluate(expression)
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def last_integer(text: str) -> int | None:
    found = INTEGER.findall(text)
    return int(found[-1].replace(",", "")) if found else None


@register_env("calculator")
class CalculatorEnv(ToolEnvironment):
    """Multiply with a calculator tool; reward: the final answer's accuracy."""

    tools = [calculator]

    def __init__(self, correct: float = 1.0, wrong: float = 0.0, system_prompt: str | None = None, format_reward: float = 0.0):
        self.correct, self.wrong, self.system_prompt = float(correct), float(wrong), system_prompt
        self.format_reward = float(format_reward)
        self.target: int | None = None
        self.called = False

    def start(self, row: EpisodeRow) -> list[dict[str, Any]]:
        self.target = int(row["answer"])
        messages = [{"role": "user", "content": row.prompt}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def step(self, text: str) -> Step:
        step = super().step(text)
        # Not solved until a final answer is right, whatever the format reward added: an episode cut
        # at max_turns after its calls ends unsolved (its return may still be the format reward).
        step.solved = step.done and last_integer(text) == self.target
        if step.tool_calls and not step.tool_errors and not self.called:
            self.called = True
            if self.format_reward:
                step.reward = self.format_reward
        return step

    def answer(self, text: str) -> float:
        return self.correct if last_integer(text) == self.target else self.wrong
