"""A small arithmetic evaluator for the calculator tool: Python's ``ast`` with an allow-list.

Only number literals, ``+ - * / // % **`` and unary ``+``/``-`` and parentheses are accepted; any
other node (names, calls, attributes, strings, ...) is refused with :class:`ArithmeticError`, so
model text is never ``eval``-ed. Exponents and operand sizes are bounded so that ``9**9**9``
cannot hang the process.
"""

from __future__ import annotations

import ast
import operator

__all__ = ["evaluate"]

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30
MAX_CHARS = 200


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression (``x`` and ``×`` read as ``*``); raises
    :class:`ArithmeticError` (or ``ZeroDivisionError``) with a short reason otherwise."""
    if not isinstance(expression, str):
        raise ArithmeticError(f"expected an expression string, got {type(expression).__name__}")
    text = expression.replace("×", "*").replace("x", "*").replace("X", "*").replace("^", "**").strip()
    if len(text) > MAX_CHARS:
        raise ArithmeticError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ArithmeticError(f"not an arithmetic expression: {expression!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ArithmeticError(f"exponent {right} too large (at most {MAX_EXPONENT})")
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, complex) or abs(result) > MAX_MAGNITUDE:
            raise ArithmeticError("result out of range")
        return result
    raise ArithmeticError(f"{type(node).__name__} is not allowed in an arithmetic expression")
