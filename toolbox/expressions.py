"""Safe evaluation of the small arithmetic expressions used in contract shapes, constraints and rooflines.

Only integer and float literals, names bound in the environment, + - * / // % **, unary minus,
comparisons, `and`/`or`/`not`, and the functions min, max, ceil_div are allowed. Nothing is
executed with `eval`.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_FUNCTIONS = {"min": min, "max": max, "ceil_div": lambda a, b: -(-a // b), "log2": math.log2}
MAX_LENGTH = 500


class ExpressionError(ValueError):
    """An expression that is malformed, uses something not allowed, or names an unknown axis."""


def names_in(expression: str) -> set[str]:
    """Names an expression refers to (functions excluded)."""
    tree = _parse(expression)
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id not in _FUNCTIONS}


def evaluate(expression: str | int | float, env: Mapping[str, int | float]) -> int | float | bool:
    """Evaluate `expression` with the names in `env`; raise ExpressionError on anything else."""
    if isinstance(expression, (int, float)) and not isinstance(expression, bool):
        return expression
    return _eval(_parse(str(expression)).body, env, str(expression))


def _parse(expression: str) -> ast.Expression:
    if len(expression) > MAX_LENGTH:
        raise ExpressionError(f"expression longer than {MAX_LENGTH} characters")
    try:
        return ast.parse(expression, mode="eval")
    except SyntaxError as error:
        raise ExpressionError(f"cannot parse {expression!r}: {error.msg}") from None


def _eval(node: ast.AST, env: Mapping[str, int | float], text: str) -> int | float | bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ExpressionError(f"{text!r} names {node.id!r}, which is not defined here")
        return env[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, env, text), _eval(node.right, env, text)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ExpressionError(f"exponent too large in {text!r}")
        try:
            return _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ExpressionError(f"division by zero in {text!r}") from None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
        value = _eval(node.operand, env, text)
        if isinstance(node.op, ast.Not):
            return not value
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, env, text) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        left = _eval(node.left, env, text)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, env, text)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        return _FUNCTIONS[node.func.id](*[_eval(arg, env, text) for arg in node.args])
    raise ExpressionError(f"{text!r} uses {type(node).__name__}, which contract expressions do not allow")
