"""A safe arithmetic evaluator over Python's AST: numbers, + - * / // % **, parentheses and a few
math functions. No names, attributes, calls to anything else, or ``eval``.

Exact rationals are kept while possible (``Fraction``), so ``1/3*3 == 1`` holds; functions such as
``sqrt`` fall back to floats.
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

Number = Fraction | float

MAX_EXPONENT = 1000
MAX_MAGNITUDE = 10**100
MAX_EXPRESSION_LENGTH = 500

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
_FUNCTIONS = {
    "sqrt": math.sqrt, "abs": abs, "log": math.log, "exp": math.exp, "sin": math.sin,
    "cos": math.cos, "tan": math.tan, "floor": math.floor, "ceil": math.ceil, "round": round,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be evaluated (message says why)."""


def evaluate(expression: str, *, allow_functions: bool = True) -> Number:
    """Value of an arithmetic ``expression``; raises CalculatorError with a reason otherwise.

    >>> evaluate("2 + 3 * (4 - 1)")
    Fraction(11, 1)
    """
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_LENGTH} characters")
    expression = expression.replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise CalculatorError(f"not a valid expression: {expression!r}") from err
    return _eval(tree.body, allow_functions)


def numbers_used(expression: str) -> list[int | float]:
    """The numeric literals in an expression, in order (to check a countdown answer's numbers)."""
    try:
        tree = ast.parse(expression.replace("^", "**").strip(), mode="eval")
    except SyntaxError as err:
        raise CalculatorError(f"not a valid expression: {expression!r}") from err
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)]


def format_number(value: Number) -> str:
    """``7``, ``-2.5``, ``1/3`` for fractions that have no short decimal form."""
    if isinstance(value, Fraction):
        if value.denominator == 1:
            return str(value.numerator)
        as_float = float(value)
        return str(as_float) if Fraction(as_float) == value else f"{value.numerator}/{value.denominator}"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def _eval(node: ast.AST, allow_functions: bool) -> Number:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(node.value) if isinstance(node.value, int) else node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, allow_functions))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, allow_functions), _eval(node.right, allow_functions)
        return _binary(node.op, left, right)
    if allow_functions and isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if (allow_functions and isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS and not node.keywords and len(node.args) == 1):
        arg = _eval(node.args[0], allow_functions)
        try:
            result = _FUNCTIONS[node.func.id](arg)
        except (ValueError, OverflowError) as err:
            raise CalculatorError(f"{node.func.id}({format_number(arg)}): {err}") from err
        return Fraction(result) if isinstance(result, int) else result
    raise CalculatorError(f"not allowed in an arithmetic expression: {ast.dump(node)[:80]}")


def _binary(op: ast.operator, left: Number, right: Number) -> Number:
    if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
        raise CalculatorError("division by zero")
    if isinstance(op, ast.Pow):
        if abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent larger than {MAX_EXPONENT}")
        if isinstance(right, Fraction) and right.denominator != 1:
            right = float(right)
        if left == 0 and right < 0:
            raise CalculatorError("zero to a negative power")
    try:
        result = _BINARY[type(op)](left, right)
    except (OverflowError, ValueError, ZeroDivisionError) as err:
        raise CalculatorError(str(err)) from err
    if isinstance(result, complex):
        raise CalculatorError("complex result")
    if abs(result) > MAX_MAGNITUDE:
        raise CalculatorError("result too large")
    return result
