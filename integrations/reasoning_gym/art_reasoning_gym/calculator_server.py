"""The calculator MCP server (stdio) this integration ships: one tool, ``calculate``.

Run it with ``python -m art_reasoning_gym.calculator_server`` (``CALCULATOR_SERVER``). The
tool's argument is bounded in length, so a grammar-constrained model always finishes it, and a
bad expression is answered with an error the model reads (the run goes on).

Example:
    >>> calculate("12 * 3")
    '36'
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from pydantic import Field

from art_reasoning_gym.calculator import MAX_EXPRESSION_CHARS, compute

app = MCPServer(
    "calculator",
    instructions="Evaluate arithmetic expressions exactly.",
    log_level="CRITICAL",
)


@app.tool()
def calculate(
    expression: str = Field(
        max_length=MAX_EXPRESSION_CHARS,
        description="An arithmetic expression, e.g. '( 56 + -33 ) - 84' or '(-3.5)^-2'",
    ),
) -> str:
    """Evaluate an arithmetic expression (numbers, + - * /, ^ with a whole exponent,
    parentheses) exactly; -2^2 is -4, (-2)^2 is 4."""
    return compute(expression)


if __name__ == "__main__":
    app.run()
