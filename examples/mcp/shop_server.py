"""The main demo's MCP server: a tiny shop whose answers can be checked by a program.

Tools: ``get_price(item)`` and ``get_stock(item)``. The prices and stock counts are made up,
so a model cannot know them: it has to call the right tool with the right item, read the
result and report the number. Every task has a known answer (``scenarios()``), so the demo
needs no LLM judge.

    python examples/mcp/shop_server.py            # serve over stdio
    python examples/mcp/shop_server.py --http     # serve over streamable HTTP on a free port
    python examples/mcp/shop_server.py --write-scenarios examples/mcp/shop_scenarios.jsonl
"""

from __future__ import annotations

import argparse
import json
from typing import Literal

from mcp.server.mcpserver import MCPServer

# Made-up numbers (distinct, so a price is never mistaken for a stock count).
PRICES = {
    "apple": 12,
    "banana": 7,
    "cherry": 31,
    "lemon": 9,
    "mango": 26,
    "orange": 14,
    "peach": 18,
    "pear": 23,
}
STOCK = {
    "apple": 40,
    "banana": 65,
    "cherry": 52,
    "lemon": 83,
    "mango": 6,
    "orange": 77,
    "peach": 38,
    "pear": 91,
}
Item = Literal["apple", "banana", "cherry", "lemon", "mango", "orange", "peach", "pear"]

PRICE_TEMPLATES = [
    "How much does {a_item} cost?",
    "What is the price of one {item}?",
    "Tell me the price of {a_item}.",
]
STOCK_TEMPLATES = [
    "How many {item}s are in stock?",
    "How many {item}s does the shop have left?",
]

app = MCPServer("shop", instructions="A fruit shop: look up prices and stock.", log_level="WARNING")


@app.tool()
def get_price(item: Item) -> str:
    """Price of one item (coins)."""
    return f"One {item} costs {PRICES[item]} coins."


@app.tool()
def get_stock(item: Item) -> str:
    """Number of items in stock."""
    return f"There are {STOCK[item]} {item}s in stock."


def scenarios() -> list[dict[str, object]]:
    """Every task of the demo with its expected answer (40: 8 items x 5 phrasings).

    One task per item is held out for validation (``metadata.split == "val"``), each with
    another phrasing, so validation asks about known items in ways not trained on for them.
    """
    out: list[dict[str, object]] = []
    for i, item in enumerate(PRICES):
        a_item = ("an " if item[0] in "aeiou" else "a ") + item
        tasks = [(t.format(item=item, a_item=a_item), PRICES[item]) for t in PRICE_TEMPLATES]
        tasks += [(t.format(item=item), STOCK[item]) for t in STOCK_TEMPLATES]
        for j, (task, answer) in enumerate(tasks):
            split = "val" if j == i % len(tasks) else "train"
            out.append(
                {"task": task, "difficulty": 1, "answer": str(answer), "metadata": {"split": split}}
            )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", action="store_true", help="serve over streamable HTTP")
    parser.add_argument("--port", type=int, default=0, help="HTTP port (0 = a free one)")
    parser.add_argument("--write-scenarios", metavar="PATH", help="write the tasks as JSONL")
    args = parser.parse_args()
    if args.write_scenarios:
        with open(args.write_scenarios, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(s) + "\n" for s in scenarios())
    elif args.http:
        from art_mcp.local import serve_http

        serve_http(app, port=args.port)
    else:
        app.run()
