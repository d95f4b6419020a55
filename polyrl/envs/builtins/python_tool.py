"""``python``: a code interpreter tool; ``python_calculator``: word problems solved with it.

The policy writes a Python snippet; the tool runs it and returns what it printed, as the
interactive interpreter would show it (a last bare expression's ``repr`` is printed too, so
``48 + 30 - 12`` answers ``66``). A snippet that raises returns what it printed before, then
``Error: <type>: <message>`` (a syntax error included), and counts as a failed call. The output is
cut to ``env.tool_output_chars`` with a note of its full length. Each call starts from an empty
namespace: nothing carries over between calls.

The tool runs only in the tool sandbox (``env.tool_sandbox.mode: process``, the default;
:mod:`polyrl.envs.sandbox`): the snippet is the policy's code, so it runs in a forked child of the
sandbox worker under the CPU, memory and wall-time limits, unable to start processes, with no
inherited environment variables; ``mode: thread`` is refused for it. The sandbox is not a
container: a snippet can read and write the files and reach the network the OS user can.

``python_calculator`` rows are the shipped arithmetic word problems, asked with the tool
(:mod:`polyrl.tasks.python_calculator`, data source ``python_calculator``); the reward and the
verdict are the calculator's (:class:`~polyrl.envs.builtins.calculator.CalculatorEnv`): ``correct``
when the final answer's last integer is the row's ``answer``, plus ``format_reward`` once for the
first turn whose calls all ran.
"""

from __future__ import annotations

import ast
import builtins

from polyrl.envs.builtins.calculator import CalculatorEnv
from polyrl.envs.registry import register_env
from polyrl.envs.sandbox import prints_result
from polyrl.envs.tools import tool

SNIPPET_NAME = "<snippet>"


@tool
@prints_result
def python(code: str) -> None:
    """Run Python code and return what it prints, e.g. print(48 + 30 - 12).

    A last bare expression's value is printed too; each call starts with no variables."""
    tree = ast.parse(code, SNIPPET_NAME, "exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(tree, SNIPPET_NAME, "exec"), namespace)  # noqa: S102 - the sandboxed child runs the policy's code
    if last is not None:
        value = eval(compile(ast.Expression(last.value), SNIPPET_NAME, "eval"), namespace)  # noqa: S307
        if value is not None:
            print(repr(value))


@register_env("python_calculator")
class PythonCalculatorEnv(CalculatorEnv):
    """Arithmetic word problems with a Python tool; reward: the final answer's accuracy."""

    tools = [python]
