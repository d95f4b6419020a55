"""``calculator``: multiply a three-digit by a two-digit number, with a calculator tool.

Rows come from ``polyrl/tasks/calculator.py`` (fields ``a``, ``b``, ``answer``). The policy may
call ``calculator`` (plain-text protocol or the chat template's tool format,
:mod:`polyrl.envs.tools`) any number of times within the turn budget; its first turn without a
tool call is its final answer. Reward: ``correct`` when the last integer of that answer equals
``a × b``, else ``wrong`` (final-answer accuracy); plus ``format_reward`` once, a shaping term for a
policy that does not call the tool yet (0 by default, so the return is the accuracy alone). When it
is paid is ``format_reward_on``: ``call`` (the default) on the first turn whose tool calls all ran;
``answer`` on the final-answer turn of an episode that made such a call, so an episode that only
calls until ``max_turns`` cuts it earns nothing (a policy paid per call learned to call on every
turn and never answer: docs/results.md, real_calculator_grpo). The tool is evaluated by
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

    FORMAT_REWARD_ON = ("call", "answer")

    def __init__(
        self,
        correct: float = 1.0,
        wrong: float = 0.0,
        system_prompt: str | None = None,
        format_reward: float = 0.0,
        format_reward_on: str = "call",
    ):
        if format_reward_on not in self.FORMAT_REWARD_ON:
            raise ValueError(
                f"env.params.format_reward_on: {format_reward_on!r} is not one of {', '.join(self.FORMAT_REWARD_ON)} "
                "(call: paid on the first turn whose tool calls ran; answer: paid on the final answer of an episode that made one)"
            )
        self.correct, self.wrong, self.system_prompt = float(correct), float(wrong), system_prompt
        self.format_reward, self.format_reward_on = float(format_reward), format_reward_on
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
        first_call = step.tool_calls and not step.tool_errors and not self.called
        if first_call:
            self.called = True
        pays = first_call if self.format_reward_on == "call" else (step.done and self.called)
        if pays and self.format_reward:
            # Added to whatever the turn earned: on an answer turn that is the accuracy reward.
            step.reward = (step.reward or 0.0) + self.format_reward
        return step

    def answer(self, text: str) -> float:
        return self.correct if last_integer(text) == self.target else self.wrong
