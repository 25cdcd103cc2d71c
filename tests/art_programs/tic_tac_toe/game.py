"""Tic-tac-toe on a 3x3 board (rows A-C, columns 1-3) against a random opponent."""

from __future__ import annotations

import random
import re

MOVE = re.compile(r"<move>\s*([ABC])([123])\s*</move>")
LINES = [[(r, c) for c in range(3)] for r in range(3)]
LINES += [[(r, c) for r in range(3)] for c in range(3)]
LINES += [[(i, i) for i in range(3)], [(i, 2 - i) for i in range(3)]]


def system_prompt(symbol: str) -> str:
    return (
        f"You play tic-tac-toe as {symbol}. Rows are A-C, columns 1-3. "
        "Answer with one empty square only, as <move>B2</move>."
    )


def new_game(rng: random.Random) -> dict:
    agent = rng.choice("xo")
    return {
        "board": [["."] * 3 for _ in range(3)],
        "agent_symbol": agent,
        "opponent_symbol": "o" if agent == "x" else "x",
        "rng": rng,
    }


def render(game: dict) -> str:
    rows = [f"{'ABC'[r]} " + " ".join(game["board"][r]) for r in range(3)]
    return "  1 2 3\n" + "\n".join(rows)


def apply_move(game: dict, answer: str) -> None:
    """Play the agent's square from ``answer``; ValueError when missing or taken."""
    found = MOVE.search(answer)
    if found is None:
        raise ValueError(f"no move in {answer!r}")
    row, col = "ABC".index(found.group(1)), int(found.group(2)) - 1
    if game["board"][row][col] != ".":
        raise ValueError(f"square {found.group(0)} is taken")
    game["board"][row][col] = game["agent_symbol"]


def empty_squares(game: dict) -> list[tuple[int, int]]:
    return [(r, c) for r in range(3) for c in range(3) if game["board"][r][c] == "."]


def opponent_move(game: dict) -> None:
    row, col = game["rng"].choice(empty_squares(game))
    game["board"][row][col] = game["opponent_symbol"]


def winner(game: dict) -> str | None:
    """``"x"``, ``"o"``, ``"draw"`` or None while the game goes on."""
    board = game["board"]
    for line in LINES:
        marks = {board[r][c] for r, c in line}
        if len(marks) == 1 and "." not in marks:
            return marks.pop()
    return "draw" if not empty_squares(game) else None
