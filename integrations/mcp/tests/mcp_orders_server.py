"""A real MCP server (mcp 2.x ``MCPServer``) whose tool takes a nested pydantic model.

The tool's input schema has ``$defs`` / ``$ref`` (pydantic nests ``Customer`` -> ``Address``
and a list of ``Line``), the shape that a forced tool call used to get a 400 on. Every field is
bounded (``Literal``, lengths) so tiny-random's grammar-forced calls finish in a few tokens.
"""

from __future__ import annotations

from typing import Literal

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, Field

app = MCPServer("orders", instructions="Place orders for customers.", log_level="CRITICAL")


class Address(BaseModel):
    city: Literal["Paris", "Lima", "Tokyo"]
    floor: Literal[0, 1, 2]


class Customer(BaseModel):
    name: str = Field(min_length=1, max_length=6)
    address: Address


class Line(BaseModel):
    sku: Literal["pen", "ink"]
    quantity: Literal[1, 2, 3]


class Order(BaseModel):
    customer: Customer
    lines: list[Line] = Field(min_length=1, max_length=2)


@app.tool()
def place_order(order: Order) -> str:
    """Place an order; answers with what was ordered, for whom and where."""
    items = ", ".join(f"{line.quantity} {line.sku}" for line in order.lines)
    return f"ORDER OK: {items} for {order.customer.name} in {order.customer.address.city}"


if __name__ == "__main__":
    app.run()
