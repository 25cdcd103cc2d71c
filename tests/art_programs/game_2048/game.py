"""A small 2048: a 4x4 board, tiles merge when pushed together; reach WINNING_VALUE to win."""

from __future__ import annotations

import random
import re
import uuid

WINNING_VALUE = 64
SYSTEM_PROMPT = (
    "You play 2048. Slide the tiles left, right, up or down so equal tiles merge. "
    "Answer with your move only, as <move>left</move>."
)
MOVE = re.compile(r"<move>\s*(left|right|up|down)\s*</move>")


def new_game(rng: random.Random) -> dict:
    board = [[0] * 4 for _ in range(4)]
    game = {"id": uuid.uuid4().hex, "board": board, "rng": rng}
    add_tile(game)
    add_tile(game)
    return game


def add_tile(game: dict) -> None:
    empty = [(r, c) for r in range(4) for c in range(4) if game["board"][r][c] == 0]
    if empty:
        r, c = game["rng"].choice(empty)
        game["board"][r][c] = 2 if game["rng"].random() < 0.9 else 4


def render(game: dict) -> str:
    return "\n".join(" ".join(f"{v or '.':>3}" for v in row) for row in game["board"])


def _slide(row: list[int]) -> list[int]:
    tiles = [v for v in row if v]
    out: list[int] = []
    while tiles:
        if len(tiles) > 1 and tiles[0] == tiles[1]:
            out.append(tiles[0] * 2)
            tiles = tiles[2:]
        else:
            out.append(tiles.pop(0))
    return out + [0] * (4 - len(out))


def apply_move(game: dict, answer: str) -> None:
    """Play the move written in ``answer``; ValueError when there is none."""
    found = MOVE.search(answer)
    if found is None:
        raise ValueError(f"no move in {answer!r}")
    board = game["board"]
    direction = found.group(1)
    rows = [list(r) for r in zip(*board, strict=True)] if direction in ("up", "down") else board
    moved = [
        _slide(row[::-1])[::-1] if direction in ("right", "down") else _slide(row) for row in rows
    ]
    if direction in ("up", "down"):
        moved = [list(r) for r in zip(*moved, strict=True)]
    if moved != board:
        game["board"] = moved
        add_tile(game)


def max_tile(game: dict) -> int:
    return max(max(row) for row in game["board"])


def finished(game: dict) -> bool:
    if max_tile(game) >= WINNING_VALUE:
        return True
    board = game["board"]
    if any(0 in row for row in board):
        return False
    return not any(
        board[r][c] == board[r][c + 1] or board[c][r] == board[c + 1][r]
        for r in range(4)
        for c in range(3)
    )
