"""The python_calculator task: the shipped arithmetic word problems, asked with a Python tool
(environment ``python_calculator``, polyrl/envs/builtins/python_tool.py).

The rows are :mod:`polyrl.tasks.word_problems`' shipped rows (the same splits, hashed on the
problem's skeleton, so no test computation is trained on), each prompt re-worded to offer the
tool::

    Mia has 14 marbles. She buys 9 more, then gives 6 to a friend. How many marbles does Mia
    have now? You may run Python code with the python tool. End with the final answer as
    "Answer: <number>".

The environment offers the ``python`` tool and scores the final answer's last integer against the
row's ``answer``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polyrl.tasks import word_problems
from polyrl.tasks.common import SPLITS

__all__ = ["INSTRUCTION", "SPLITS", "map_row", "python_prompt", "shipped_path"]

INSTRUCTION = 'You may run Python code with the python tool. End with the final answer as "Answer: <number>".'


def python_prompt(prompt: str) -> str:
    """A word problem's question with the tool offered in place of the step-by-step instruction."""
    return f"{prompt.removesuffix(word_problems.INSTRUCTION).rstrip()} {INSTRUCTION}"


def map_row(row: dict[str, Any]) -> dict[str, Any]:
    """A shipped word problem as this task asks it (the data loader maps every row through this)."""
    prompt = python_prompt(row["prompt"])
    return {"prompt": prompt, "messages": [{"role": "user", "content": prompt}]}


def shipped_path(split: str) -> Path:
    return word_problems.shipped_path(split)
