"""``compute``: the arithmetic behind ``calculate``, the calculator tool this integration ships.

reasoning-gym's arithmetic generators (``basic_arithmetic``, ``chain_sum``, ``products``,
``power_function``, ``decimal_arithmetic`` ...) ask for the value of an expression; a small
model can learn to hand the expression to this tool and report its result. The tool evaluates
``+ - * /``, powers with a whole exponent (``^`` or ``**``, at most 64 in size), parentheses,
unary minus and decimals exactly (``fractions.Fraction``, never ``eval``), with Python's
precedence (``-2^2`` is -4, ``(-2)^2`` is 4), and answers with an integer when the value is
whole, else with 10 significant digits.

The tool itself is served by ``python -m art_reasoning_gym.calculator_server`` (an MCP server
over stdio; ``CALCULATOR_SERVER`` is that command, as ``art_mcp.rollout`` and ``art_mcp.train``
take it).

Example:
    >>> compute("( 56 + -33 ) - 84")
    '-61'
    >>> compute("7 / 2"), compute("1 / 3"), compute("(-352.3345)^-2")
    ('3.5', '0.3333333333', '8.055447262e-06')
"""

from __future__ import annotations

import ast
from fractions import Fraction

# The MCP server that offers ``calculate`` (art_reasoning_gym.calculator_server), as the
# command line art_mcp takes (``python`` there means the interpreter running art_mcp).
CALCULATOR_SERVER = "python -m art_reasoning_gym.calculator_server"
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
_DIGITS = 10


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _value(node.operand)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = _value(node.left), _value(node.right)
        if exponent.denominator != 1 or abs(exponent) > MAX_EXPONENT:
            raise ValueError(f"exponents must be whole numbers of size <= {MAX_EXPONENT}")
        if base == 0 and exponent < 0:
            raise ValueError("division by zero")
        return base ** int(exponent)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if right == 0:
            raise ValueError("division by zero")
        return left / right
    raise ValueError(f"unsupported in an arithmetic expression: {ast.unparse(node)!r}")


def compute(expression: str) -> str:
    """The exact value of ``expression`` (numbers, ``+ - * / ^``, parentheses), as text; raises
    ``ValueError`` saying what is wrong with anything else.

    Example:
        >>> compute("2 * (3 + 4)")
        '14'
        >>> compute("2 ^ 8"), compute("-2 ** 2")
        ('256', '-4')
        >>> compute("2 % 8")
        Traceback (most recent call last):
        ...
        ValueError: unsupported in an arithmetic expression: '2 % 8'
    """
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    if not text:
        raise ValueError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {text!r}") from exc
    value = _value(tree)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.{_DIGITS}g}"
