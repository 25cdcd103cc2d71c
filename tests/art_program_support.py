"""Stand-in base models for the ART-style programs (``tests/art_programs``).

Code written for ART trains 3B-8B instruct models that already answer in the format a game
asks for (``<move>left</move>``); rewards only differ between rollouts when moves are valid.
tiny-random answers noise, so every rollout would get the same reward and no step would train.
A stand-in is tiny-random fine-tuned (plain supervised steps on the games' own conversations,
moves chosen at random) until it writes moves in that format: it knows the format, not the
game. Built once per recipe into the embedded-models folder, seeded, so runs reuse it.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from types import ModuleType

from art_core.testing.fine_tuned import fine_tuned_stand_in as build_stand_in

PROGRAMS = Path(__file__).resolve().parent / "art_programs"


def load_game(folder: str) -> ModuleType:
    """A program's ``game.py`` under a name of its own (both programs name it ``game``)."""
    path = PROGRAMS / folder / "game.py"
    spec = importlib.util.spec_from_file_location(f"art_program_{folder}_game", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def conversations_2048(
    games: int, seed: int, moves: tuple[str, ...] = ("left", "up")
) -> list[list[dict[str, str]]]:
    """Games of 2048 played with random ``moves``, as the program's rollout writes them."""
    game_module = load_game("game_2048")
    rng = random.Random(seed)
    out = []
    for _ in range(games):
        game = game_module.new_game(rng)
        messages = [{"role": "system", "content": game_module.SYSTEM_PROMPT}]
        for _ in range(8):
            messages.append({"role": "user", "content": game_module.render(game)})
            move = f"<move>{rng.choice(moves)}</move>"
            messages.append({"role": "assistant", "content": move})
            game_module.apply_move(game, move)
            if game_module.finished(game):
                break
        out.append(messages)
    return out


def conversations_tic_tac_toe(games: int, seed: int) -> list[list[dict[str, str]]]:
    """Games of tic-tac-toe with random valid moves, as the program's rollout writes them."""
    game_module = load_game("tic_tac_toe")
    rng = random.Random(seed)
    out = []
    for _ in range(games):
        game = game_module.new_game(rng)
        messages = [{"role": "system", "content": game_module.system_prompt(game["agent_symbol"])}]
        if game["agent_symbol"] == "o":
            game_module.opponent_move(game)
        while game_module.winner(game) is None:
            messages.append({"role": "user", "content": game_module.render(game)})
            row, col = rng.choice(game_module.empty_squares(game))
            move = f"<move>{'ABC'[row]}{col + 1}</move>"
            messages.append({"role": "assistant", "content": move})
            game_module.apply_move(game, move)
            if game_module.winner(game) is None:
                game_module.opponent_move(game)
        out.append(messages)
    return out


__all__ = ["PROGRAMS", "build_stand_in", "conversations_2048", "conversations_tic_tac_toe"]
